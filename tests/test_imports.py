"""Import cost: ``import actorrt`` loads no heavy dependency, and a model
without LLM contrib ops loads and runs without numba. Each check runs in a
fresh interpreter (what a module imports shows in ``sys.modules``); none is
a timed assertion."""

import json
import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

import actorrt

ROOT = Path(actorrt.__file__).resolve().parent.parent
HEAVY = ("numba", "llvmlite", "sympy", "onnxruntime", "scipy", "torch", "onnx_ir", "onnx",
         "numpy", "trio")


def _run(code: str) -> dict[str, set[str]]:
    """Run ``code`` in a fresh interpreter; each ``snap(label)`` it calls
    records the top-level modules imported by then."""
    script = textwrap.dedent("""
        import json, sys
        _snaps = {}
        def snap(label):
            _snaps[label] = sorted({m.split(".")[0] for m in sys.modules})
    """) + textwrap.dedent(code) + 'print("SNAPS=" + json.dumps(_snaps))\n'
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, cwd=str(ROOT), timeout=300)
    assert out.returncode == 0, out.stderr
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("SNAPS="))
    return {k: set(v) for k, v in json.loads(line.removeprefix("SNAPS=")).items()}


def test_import_then_plain_models_load_no_heavy_dependency():
    snaps = _run("""
        import actorrt
        snap("import")
        assert "InferenceSession" in dir(actorrt) and "open_session" in dir(actorrt)
        from actorrt import InferenceSession, Tensor, open_session
        assert actorrt.InferenceSession is InferenceSession
        assert actorrt.Tensor is Tensor and callable(open_session)
        ns = {}
        exec("from actorrt import *", ns)
        assert set(actorrt.__all__) <= set(ns), set(actorrt.__all__) - set(ns)
        try:
            actorrt.no_such_name
        except AttributeError as e:
            assert "no_such_name" in str(e)
        else:
            raise AssertionError("no AttributeError")

        import numpy as np
        from onnx import TensorProto as TP, helper, numpy_helper

        def run(g, feeds):
            m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
            with actorrt.InferenceSession(m.SerializeToString()) as s:
                return s.run(None, feeds)

        # a one-node Add
        g = helper.make_graph([helper.make_node("Add", ["a", "b"], ["c"])], "add",
                              [helper.make_tensor_value_info(n, TP.FLOAT, [3]) for n in "ab"],
                              [helper.make_tensor_value_info("c", TP.FLOAT, [3])])
        out = run(g, {"a": np.float32([1, 2, 3]), "b": np.float32([4, 5, 6])})
        assert out[0].tolist() == [5, 7, 9], out
        snap("add")

        # more than the fusion pass's minimum of steps, with ops its LLM
        # patterns start from (Gather, ReduceSum), but no com.microsoft op
        nodes = [helper.make_node("Gather", ["table", "ids"], ["e"]),
                 helper.make_node("ReduceSum", ["mask", "one"], ["n"], keepdims=0)]
        prev = "e"
        for i in range(10):
            nodes.append(helper.make_node("Abs" if i % 2 else "Neg", [prev], [f"t{i}"]))
            prev = f"t{i}"
        nodes.append(helper.make_node("Identity", [prev], ["y"]))
        table = np.arange(12, dtype=np.float32).reshape(4, 3)
        g = helper.make_graph(nodes, "plain",
            [helper.make_tensor_value_info("ids", TP.INT64, [2]),
             helper.make_tensor_value_info("mask", TP.INT64, [1, 2])],
            [helper.make_tensor_value_info("y", TP.FLOAT, [2, 3]),
             helper.make_tensor_value_info("n", TP.INT64, [1])],
            [numpy_helper.from_array(table, "table"),
             numpy_helper.from_array(np.int64([1]), "one")])
        out = run(g, {"ids": np.int64([1, 3]), "mask": np.int64([[1, 1]])})
        np.testing.assert_array_equal(out[0], table[[1, 3]])  # |-(|-x|)| = x
        assert out[1].tolist() == [2]
        snap("plain")

        # onnx-ir's sympy loads on first symbolic arithmetic, and works
        import onnx_ir as ir
        d = ir.SymbolicDim("N")
        assert str(d) == "N"
        snap("symbolic dim")
        assert str(d * 2 + 1) == "2*N + 1"
        import sympy
        import sympy.core
        assert type(sympy) is type(sys) and str(sympy.Symbol("x") + 1) == "x + 1"
        import onnx_ir._core as core
        assert core.sympy is sympy  # the stand-in replaced itself
    """)
    assert not snaps["import"] & set(HEAVY), sorted(snaps["import"] & set(HEAVY))
    for label in ("add", "plain"):
        assert not snaps[label] & {"numba", "llvmlite", "sympy", "onnxruntime"}, label
    assert "sympy" not in snaps["symbolic dim"]


def test_sympy_imported_first_is_left_alone():
    _run("""
        import sympy
        import actorrt
        actorrt.InferenceSession
        import onnx_ir._core as core
        assert core.sympy is sympy
    """)


def test_llm_kernels_still_reach_numba_on_first_use():
    pytest.importorskip("numba")
    snaps = _run("""
        from actorrt.providers.cpu import contrib
        snap("contrib")
        contrib._nb.HAVE_NUMBA  # first use: the module, and numba, load
        snap("used")
        from actorrt.providers.cpu.llm import _contrib_numba
        assert contrib._nb is _contrib_numba  # the stand-in replaced itself
    """)
    assert "numba" not in snaps["contrib"] and "numba" in snaps["used"]


def test_py_typed_is_shipped():
    assert (ROOT / "actorrt" / "py.typed").is_file()
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in conf["tool"]["setuptools"]["package-data"]["actorrt"]
