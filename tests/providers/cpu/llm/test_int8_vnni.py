"""The VNNI (``vpdpbusd``) int8 kernels against the AVX2 ones and the integer
reference.

Oracle: the integer reference of test_int8_tiles.py (exact int64 block sums
of MatMulNBits' own unpacked weights, float64 scales), and bit equality with
the AVX2 path (``vpmaddubsw`` + ``vpmaddwd``): the same process's kernels
compiled with ``ACTORRT_INT8_VNNI=0`` in a subprocess (its own numba cache
folder), fed the same packed weights and activations.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from actorrt.providers.cpu import _numba_cache
from actorrt.providers.cpu.llm import _contrib_int8 as ci
from actorrt.providers.cpu.llm import _contrib_numba as nbk
from actorrt.providers.cpu.llm import _contrib_quant as cq
from actorrt.providers.cpu.llm import _int8_panel as ip
from actorrt.providers.cpu.llm import _int8_tiles as it

from .test_int8_tiles import integer_reference, weights

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))
ROWS = (1, 2, 3, 7, 8, 16, 33, 512)
# N = 63: three 16-column wide-panel chunks, one 8-column chunk, one group
# of four, three tail columns; K = 208 (seven blocks) and 80 (three blocks,
# zero-padded to 96)
CASES = [(bits, zp_kind, layout, k)
         for bits in (4, 8) for zp_kind in ("none", "packed") for layout in ("half", "f32")
         for k in ((208,) if layout == "half" else (80,))]

needs_vnni = pytest.mark.skipif(
    not it.HAVE_VNNI, reason="the host has neither AVX-VNNI nor AVX-512 VNNI + VL (or numba "
                             "compiles for another CPU): only the AVX2 path exists")
needs_default = pytest.mark.skipif(
    it.HAVE_VNNI and not it.USE_VNNI, reason="ACTORRT_INT8_VNNI=0 forces the AVX2 path here")

_WORKER = r"""
import json, sys
import numpy as np
from actorrt.providers.cpu import _numba_cache
from actorrt.providers.cpu.llm import _contrib_int8 as ci
from actorrt.providers.cpu.llm import _contrib_numba as nbk
from actorrt.providers.cpu.llm import _int8_panel as ip
from actorrt.providers.cpu.llm import _int8_tiles as it
src, dst = sys.argv[1], sys.argv[2]
assert not it.USE_VNNI and not ip.WIDE_PANEL
got = {}
with np.load(src) as f:
    names = sorted({k.split("/")[0] for k in f.files})
    for c in names:
        a, qi, sc, dz = (f[c + "/" + x] for x in ("a", "qi", "scales", "dz"))
        bits = int(f[c + "/bits"])
        serial = ci._serial_q4 if bits == 4 else ci._serial_q8
        for m in json.loads(sys.argv[3]):
            out = np.empty((m, qi.shape[0]), np.float32)
            serial(a[:m], qi, sc, dz, out)
            got[f"{c}/M{m}"] = out
        par = np.empty((a.shape[0], qi.shape[0]), np.float32)
        nbk.set_num_threads(2)
        nbk._parallel(ci._par_q4 if bits == 4 else ci._par_q8, a, qi, sc, dz, par, 3)
        got[c + "/par"] = par
np.savez(dst, **got)
print(json.dumps({"variants": _numba_cache.variants()}))
"""


def _case(rng, bits, zp_kind, layout, k, n=63):
    nb = -(-k // 32)
    b, s, zp = weights(rng, n, nb, bits, zp_kind, layout)
    p = cq.pack_nbits(b.reshape(n, -1), s, zp, k=k, n=n, bits=bits, block_size=32,
                      use_numba=True, int8=True)
    m = max(ROWS)
    a = np.zeros((m, nb * 32), np.float32)
    a[:, :k] = rng.standard_normal((m, k)) * rng.choice([0.1, 1.0, 30.0], (m, k))
    return b.reshape(n, -1), s, zp, p, a


@pytest.fixture(scope="module")
def avx2_outputs(tmp_path_factory):
    """Every case's outputs from the AVX2 kernels (a subprocess with
    ``ACTORRT_INT8_VNNI=0`` and a numba cache folder of its own), and the
    inputs they were computed from."""
    tmp = tmp_path_factory.mktemp("int8_avx2")
    rng = np.random.default_rng(20)
    inputs, arrays = {}, {}
    for i, (bits, zp_kind, layout, k) in enumerate(CASES):
        name = f"c{i}"
        inputs[name] = _case(rng, bits, zp_kind, layout, k)
        b, s, zp, p, a = inputs[name]
        arrays.update({name + "/a": a, name + "/qi": p.qi, name + "/scales": p.scales,
                       name + "/dz": np.asarray(p.dz), name + "/bits": np.int64(bits)})
    np.savez(tmp / "in.npz", **arrays)
    env = dict(os.environ, ACTORRT_INT8_VNNI="0", NUMBA_CACHE_DIR=str(tmp / "numba"),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    run = subprocess.run([sys.executable, "-c", _WORKER, str(tmp / "in.npz"),
                          str(tmp / "out.npz"), json.dumps(ROWS)],
                         env=env, cwd=ROOT, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr[-4000:]
    info = json.loads(run.stdout.strip().splitlines()[-1])
    with np.load(tmp / "out.npz") as f:
        return inputs, {k: f[k] for k in f.files}, info


@pytest.mark.slow  # the AVX2 subprocess compiles every int8 kernel once more (~1-2 min)
@needs_vnni
@needs_default
def test_the_switch_joins_the_cache_stamp(avx2_outputs):
    assert it.USE_VNNI and ip.WIDE_PANEL == it.HAVE_VNNI512
    assert _numba_cache.variants() == ()  # unset here: the stamps as before
    assert avx2_outputs[2]["variants"] == [["ACTORRT_INT8_VNNI", "0"]]


@pytest.mark.slow
@needs_vnni
@needs_default
@pytest.mark.parametrize("case", range(len(CASES)),
                         ids=["b{}-{}-{}-k{}".format(*c) for c in CASES])
def test_vnni_equals_avx2_and_the_integer_reference(avx2_outputs, case):
    inputs, avx2, _ = avx2_outputs
    bits, zp_kind, layout, k = CASES[case]
    b, s, zp, p, a = inputs[f"c{case}"]
    serial = ci._serial_q4 if bits == 4 else ci._serial_q8
    want, mag = integer_reference(a, b, s, zp, bits)
    for m in ROWS:
        got = np.empty((m, p.qi.shape[0]), np.float32)
        serial(a[:m], p.qi, p.scales, p.dz, got)
        np.testing.assert_array_equal(got, avx2[f"c{case}/M{m}"], err_msg=f"M={m}")
        assert np.all(np.abs(got - want[:m]) <= 1e-5 * mag[:m] + 1e-30), f"M={m}"
    par = np.empty((a.shape[0], p.qi.shape[0]), np.float32)
    nbk.set_num_threads(2)
    try:
        nbk._parallel(ci._par_q4 if bits == 4 else ci._par_q8, a, p.qi, p.scales, p.dz, par, 3)
    finally:
        nbk.set_num_threads(None)
    np.testing.assert_array_equal(par, avx2[f"c{case}/par"])


def test_another_target_cpu_declines_vnni():
    # numba compiling for another CPU (NUMBA_CPU_NAME): neither path's
    # intrinsics are assumed (the kernels do not exist; the numpy fallback runs)
    env = dict(os.environ, NUMBA_CPU_NAME="generic",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    run = subprocess.run(
        [sys.executable, "-c", "from actorrt.providers.cpu.llm import _int8_tiles as it; "
         "print(it.HAVE_INT8_DOT, it.HAVE_VNNI, it.HAVE_VNNI512, it.USE_VNNI)"],
        env=env, cwd=ROOT, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["False"] * 4
