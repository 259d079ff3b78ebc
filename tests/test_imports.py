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


def _modules_after(code: str) -> set[str]:
    """Top-level module names imported by ``code`` run in a fresh interpreter."""
    script = textwrap.dedent(code) + textwrap.dedent("""
        import json, sys
        print("MODULES=" + json.dumps(sorted({m.split(".")[0] for m in sys.modules})))
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, cwd=str(ROOT), timeout=300)
    assert out.returncode == 0, out.stderr
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("MODULES="))
    return set(json.loads(line.removeprefix("MODULES=")))


def test_import_actorrt_loads_no_heavy_dependency():
    mods = _modules_after("import actorrt")
    assert not mods & set(HEAVY), sorted(mods & set(HEAVY))


def test_public_names_resolve_on_first_use():
    mods = _modules_after("""
        import actorrt
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
    """)
    assert "numba" not in mods


_RUN_MODEL = """
    import numpy as np
    from onnx import TensorProto as TP, helper, numpy_helper
    import actorrt
    {build}
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with actorrt.InferenceSession(m.SerializeToString()) as s:
        out = s.run(None, feeds)
    {check}
"""


def test_running_an_add_model_never_imports_numba():
    mods = _modules_after(_RUN_MODEL.format(
        build="""g = helper.make_graph([helper.make_node("Add", ["a", "b"], ["c"])], "add",
                              [helper.make_tensor_value_info(n, TP.FLOAT, [3]) for n in "ab"],
                              [helper.make_tensor_value_info("c", TP.FLOAT, [3])])
    feeds = {"a": np.float32([1, 2, 3]), "b": np.float32([4, 5, 6])}""",
        check="assert out[0].tolist() == [5, 7, 9], out"))
    assert "numba" not in mods and "llvmlite" not in mods
    assert "sympy" not in mods  # onnx-ir's sympy loads on first symbolic arithmetic only


def test_sympy_still_works_after_onnx_ir_deferred_it():
    _modules_after("""
        import sys
        import actorrt
        actorrt.InferenceSession  # imports onnx-ir
        import onnx_ir as ir
        assert "sympy" not in sys.modules
        d = ir.SymbolicDim("N")
        assert str(d) == "N" and "sympy" not in sys.modules
        assert str(d * 2 + 1) == "2*N + 1"  # symbolic arithmetic: sympy loads now
        import sympy
        import sympy.core
        assert type(sympy) is type(sys) and str(sympy.Symbol("x") + 1) == "x + 1"
        import onnx_ir._core as core
        assert core.sympy is sympy  # the stand-in replaced itself
    """)
    # a user who imports sympy first gets it untouched
    _modules_after("""
        import sympy
        import actorrt
        actorrt.InferenceSession
        import onnx_ir._core as core
        assert core.sympy is sympy
    """)


def test_a_larger_plain_onnx_model_never_imports_numba():
    # more than the fusion pass's minimum of steps, with the ops its LLM
    # patterns start from (Gather, ReduceSum), but no com.microsoft op
    mods = _modules_after(_RUN_MODEL.format(
        build="""nodes = [helper.make_node("Gather", ["table", "ids"], ["e"]),
             helper.make_node("ReduceSum", ["mask", "one"], ["n"], keepdims=0)]
    prev = "e"
    for i in range(10):
        nodes.append(helper.make_node("Abs" if i % 2 else "Neg", [prev], [f"t{i}"]))
        prev = f"t{i}"
    nodes.append(helper.make_node("Identity", [prev], ["y"]))
    g = helper.make_graph(nodes, "plain",
        [helper.make_tensor_value_info("ids", TP.INT64, [2]),
         helper.make_tensor_value_info("mask", TP.INT64, [1, 2])],
        [helper.make_tensor_value_info("y", TP.FLOAT, [2, 3]),
         helper.make_tensor_value_info("n", TP.INT64, [1])],
        [numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3), "table"),
         numpy_helper.from_array(np.int64([1]), "one")])
    feeds = {"ids": np.int64([1, 3]), "mask": np.int64([[1, 1]])}""",
        check="""want = np.arange(12, dtype=np.float32).reshape(4, 3)[[1, 3]]  # |-(|-x|)| = x
    np.testing.assert_array_equal(out[0], want)
    assert out[1].tolist() == [2]"""))
    assert "numba" not in mods and "llvmlite" not in mods


def test_llm_kernels_still_reach_numba_on_first_use():
    pytest.importorskip("numba")
    mods = _modules_after("""
        import numpy as np
        from actorrt.providers.cpu import contrib
        import sys
        assert "numba" not in sys.modules
        x = np.ones((1, 2, 64), np.float32)
        contrib._nb.HAVE_NUMBA  # first use: the module, and numba, load
        assert "numba" in sys.modules
        from actorrt.providers.cpu.llm import _contrib_numba
        assert contrib._nb is _contrib_numba  # the stand-in replaced itself
    """)
    assert "numba" in mods


def test_py_typed_is_shipped():
    assert (ROOT / "actorrt" / "py.typed").is_file()
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in conf["tool"]["setuptools"]["package-data"]["actorrt"]
