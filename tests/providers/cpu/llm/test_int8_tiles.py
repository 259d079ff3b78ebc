"""The many-row int8 MatMulNBits kernel (rows x columns tiles).

Oracle: an integer reference. The activations are quantized once
(:func:`quantize_rows`, itself checked against the block int8 round trip in
test_contrib_int8.py), the block dot products are summed exactly in int64 from
the unpacked weights (MatMulNBits' own layout, :func:`unpack_bits`), and the
scales applied in float64. And a row's outputs are bit for bit the same
whether it runs alone (M = 1, decode) or among M rows (batched decode,
prefill), serial or parallel.
"""

import numpy as np
import pytest

from actorrt.providers.cpu.llm import _contrib_int8 as ci
from actorrt.providers.cpu.llm import _contrib_numba as nbk
from actorrt.providers.cpu.llm import _contrib_quant as cq
from actorrt.providers.cpu.llm import _int8_panel as ip

needs_int8 = pytest.mark.skipif(not ci.HAVE_INT8_DOT, reason="needs numba and an AVX2 CPU")

ROWS = (1, 2, 3, 7, 8, 16, 33, 512)


def weights(rng, n, nb, bits, zp_kind, layout):
    """MatMulNBits B (N, nb, 16 or 32) uint8, scales (N, nb) float32 and packed
    zero points (or None) with the values giving the wanted prepacked layout:
    "half" -- float16-exact scales and scale * zero points (embedded in the
    weight stream), "f32" -- scales float16 cannot hold (separate arrays)."""
    b = rng.integers(0, 256, (n, nb, 16 if bits == 4 else 32), dtype=np.uint8)
    s = (rng.random((n, nb)) * 0.02 + 0.001).astype(np.float32)
    if layout == "half":
        s = s.astype(np.float16).astype(np.float32)
    if zp_kind == "none":
        return b, s, None
    if layout == "half":  # zero points whose scale * zp (- 128) float16 holds
        z = rng.choice([0, 1, 2, 4, 8] if bits == 4 else [0, 64, 96, 128, 160, 192],
                       (n, nb)).astype(np.uint8)
    else:
        z = rng.integers(0, 1 << bits, (n, nb), dtype=np.uint8)
    if bits == 8:
        return b, s, z
    zp = np.zeros((n, -(-nb // 2)), np.uint8)
    for j in range(nb):  # two 4-bit zero points a byte, the first in the low nibble
        zp[:, j // 2] |= z[:, j] << (4 * (j % 2))
    return b, s, zp


def integer_reference(a, b, s, zp, bits):
    """(M, N) float64 outputs and the float64 sum of each output's terms'
    magnitudes (for the float32 accumulation's rounding bound)."""
    n, nb = s.shape
    xq, sx, _ = ci.quantize_rows(a)
    blocks = xq.reshape(a.shape[0], nb, 2, 16).astype(np.int64)
    x = np.empty((a.shape[0], nb, 32), np.int64)  # natural order
    x[..., 0::2], x[..., 1::2] = blocks[:, :, 0], blocks[:, :, 1]
    q = cq.unpack_bits(b.reshape(n, nb, -1), bits, 32).astype(np.int64).reshape(n, nb, 32)
    z = cq._zero_points(zp, n=n, nb=nb, bits=bits).astype(np.int64)
    isum = np.einsum("nbi,mbi->mnb", q - z[..., None], x)  # exact integers
    terms = isum * (s.astype(np.float64)[None] * sx.astype(np.float64)[:, None, :])
    return terms.sum(-1), np.abs(terms).sum(-1) + np.abs(
        np.einsum("nb,mbi->mnb", s * z, x).astype(np.float64) * sx[:, None, :]).sum(-1)


@needs_int8
@pytest.mark.parametrize("layout", ["half", "f32"])
@pytest.mark.parametrize("zp_kind", ["none", "packed"])
@pytest.mark.parametrize("bits", [4, 8])
def test_many_rows_equal_one_row_and_the_integer_reference(bits, zp_kind, layout):
    rng = np.random.default_rng(bits * 10 + len(zp_kind) + len(layout))
    n, nb = 70, 3  # N % 4 = 2 (two tail columns); K = 80 zero-padded to 96
    k = 80
    b, s, zp = weights(rng, n, nb, bits, zp_kind, layout)
    p = cq.pack_nbits(b.reshape(n, -1), s, zp, k=k, n=n, bits=bits, block_size=32,
                      use_numba=True, int8=True)
    embedded = p.scales.dtype != np.float32
    assert embedded == (layout == "half")
    if embedded and bits == 8 and zp_kind == "none":
        assert p.dz is ci.NO_ZERO_POINTS  # Q8_0: symmetric, no zero-point terms
    a = np.zeros((max(ROWS), nb * 32), np.float32)
    a[:, :k] = rng.standard_normal((max(ROWS), k)) * rng.choice([0.1, 1.0, 30.0], (max(ROWS), k))
    serial = ci._serial_q4 if bits == 4 else ci._serial_q8
    alone = np.empty((max(ROWS), n), np.float32)
    for r in range(max(ROWS)):
        serial(a[r:r + 1], p.qi, p.scales, p.dz, alone[r:r + 1])
    want, mag = integer_reference(a, b.reshape(n, -1), s, zp, bits)
    assert np.all(np.abs(alone - want) <= 1e-5 * mag + 1e-30)
    for m in ROWS:
        got = np.empty((m, n), np.float32)
        serial(a[:m], p.qi, p.scales, p.dz, got)
        np.testing.assert_array_equal(got, alone[:m], err_msg=f"M={m}")
        par = np.empty((m, n), np.float32)
        nbk.set_num_threads(2)
        try:
            nbk._parallel(ci._par_q4 if bits == 4 else ci._par_q8, a[:m], p.qi, p.scales, p.dz,
                          par, 3)
        finally:
            nbk.set_num_threads(None)
        np.testing.assert_array_equal(par, alone[:m], err_msg=f"M={m}, parallel")


@needs_int8
def test_tiles_cross_row_blocks_and_column_chunks():
    # rows past ROW_BLOCK (read when compiling: the default's boundaries) and
    # five parallel column chunks: the same bits as one row at a time
    rng = np.random.default_rng(7)
    n, nb = 517, 18  # K 576 (SmolLM2's hidden size), N % 4 = 1
    b, s, zp = weights(rng, n, nb, 4, "packed", "f32")
    p = cq.pack_nbits(b.reshape(n, -1), s, zp, k=nb * 32, n=n, bits=4, block_size=32,
                      use_numba=True, int8=True)
    m = 2 * ci.ROW_BLOCK + 5
    a = rng.standard_normal((m, nb * 32)).astype(np.float32)
    whole = np.empty((m, n), np.float32)
    ci._serial_q4(a, p.qi, p.scales, p.dz, whole)
    for r in (0, ci.ROW_BLOCK - 1, ci.ROW_BLOCK, m - 1):
        one = np.empty((1, n), np.float32)
        ci._serial_q4(a[r:r + 1], p.qi, p.scales, p.dz, one)
        np.testing.assert_array_equal(whole[r], one[0])
    par = np.empty((m, n), np.float32)
    nbk.set_num_threads(2)
    try:
        nbk._parallel(ci._par_q4, a, p.qi, p.scales, p.dz, par, 5)
    finally:
        nbk.set_num_threads(None)
    np.testing.assert_array_equal(par, whole)
    want, mag = integer_reference(a, b.reshape(n, -1), s, zp, 4)
    assert np.all(np.abs(whole - want) <= 1e-5 * mag + 1e-30)


@needs_int8
@pytest.mark.parametrize("bits", [4, 8])
def test_largest_products_do_not_overflow(bits):
    # every weight at its largest magnitude (4-bit: 15, the four columns'
    # products summed in int16 before widening; 8-bit: q - 128 = -128 and
    # 127) times activations quantizing to +-127: the integer reference's sums
    rng = np.random.default_rng(bits)
    n, nb = 9, 4
    for fill in ((0xFF,) if bits == 4 else (0x00, 0xFF)):
        b = np.full((n, nb, 16 if bits == 4 else 32), fill, np.uint8)
        s = (rng.random((n, nb)) * 0.02 + 0.001).astype(np.float32)
        p = cq.pack_nbits(b.reshape(n, -1), s, None, k=nb * 32, n=n, bits=bits, block_size=32,
                          use_numba=True, int8=True)
        a = np.ones((6, nb * 32), np.float32)
        a[1] = -1.0
        a[2, ::2] = -1.0  # alternating signs
        a[3] *= 1e-3
        a[4, :32] = 0.0  # an all-zero block
        a[5] = rng.choice([-1.0, 1.0], nb * 32)
        a = np.concatenate([a, a[::-1]])  # 12 rows: the panel tiles too (4-bit, M >= 8)
        got = np.empty((a.shape[0], n), np.float32)
        (ci._serial_q4 if bits == 4 else ci._serial_q8)(a, p.qi, p.scales, p.dz, got)
        want, mag = integer_reference(a, b.reshape(n, -1), s, None, bits)
        assert np.all(np.abs(got - want) <= 1e-5 * mag + 1e-30), fill


@needs_int8
@pytest.mark.parametrize("layout", ["half", "f32"])
def test_panel_tiles_equal_one_row_across_row_passes(layout):
    # 4-bit from PANEL_MIN_ROWS rows: eight columns against the unpacked panel,
    # rows past PANEL_ROWS (a second pass), N = 76 (nine panel chunks and one
    # group of four left to the paired tiles), parallel column chunks starting
    # at odd groups: the one-row tiles' bits and the integer reference
    assert ip.PANEL_MIN_ROWS > 0
    rng = np.random.default_rng(11)
    n, nb = 76, 5
    b, s, zp = weights(rng, n, nb, 4, "packed", layout)
    p = cq.pack_nbits(b.reshape(n, -1), s, zp, k=nb * 32, n=n, bits=4, block_size=32,
                      use_numba=True, int8=True)
    m = ip.PANEL_ROWS + 7
    a = (rng.standard_normal((m, nb * 32)) * rng.choice([0.1, 1.0, 30.0], (m, nb * 32))
         ).astype(np.float32)
    alone = np.empty((m, n), np.float32)
    for r in range(m):
        ci._serial_q4(a[r:r + 1], p.qi, p.scales, p.dz, alone[r:r + 1])
    for rows in (ip.PANEL_MIN_ROWS, ip.PANEL_MIN_ROWS + 3, m):
        got = np.empty((rows, n), np.float32)
        ci._serial_q4(a[:rows], p.qi, p.scales, p.dz, got)
        np.testing.assert_array_equal(got, alone[:rows], err_msg=f"M={rows}")
    par = np.empty((m, n), np.float32)
    nbk.set_num_threads(2)
    try:
        nbk._parallel(ci._par_q4, a, p.qi, p.scales, p.dz, par, 3)
    finally:
        nbk.set_num_threads(None)
    np.testing.assert_array_equal(par, alone)
    want, mag = integer_reference(a, b.reshape(n, -1), s, zp, 4)
    assert np.all(np.abs(alone - want) <= 1e-5 * mag + 1e-30)


@needs_int8
@pytest.mark.parametrize("bits,zp_kind", [(4, "packed"), (8, "packed"), (8, "none")])
@pytest.mark.parametrize("layout", ["half", "f32"])
def test_wide_decode_tiles_equal_one_row(layout, bits, zp_kind):
    # a decode batch (2 .. PANEL_MIN_ROWS - 1 rows): sixteen columns at a
    # time in zmm tiles of 8 / 4 / 2 / 1 rows (_int8_wide) where the host has
    # AVX-512 VNNI, else the ymm tiles. 4-bit with zero points; 8-bit with
    # zero points and without (GGUF Q8_0: symmetric, "half" then has no
    # zero-point terms at all).
    # N = 87: five 16-column chunks, one group of four, three tail columns;
    # K = 208 (seven blocks, zero-padded); parallel chunks starting at odd
    # groups; an output that is a column slice of a wider array (row pitch
    # > N). The one-row tiles' bits and the integer reference
    from actorrt.providers.cpu.llm import _int8_tiles as it
    from actorrt.providers.cpu.llm import _int8_wide as iw
    rng = np.random.default_rng(23)
    n, nb, k = 87, 7, 208
    b, s, zp = weights(rng, n, nb, bits, zp_kind, layout)
    if bits == 8:  # the extremes: q - 128 = -128 and 127 next to each other
        b[0, :, :2] = (0, 255)
    p = cq.pack_nbits(b.reshape(n, -1), s, zp, k=k, n=n, bits=bits, block_size=32,
                      use_numba=True, int8=True)
    serial = ci._serial_q4 if bits == 4 else ci._serial_q8
    par_kernel = ci._par_q4 if bits == 4 else ci._par_q8
    on = iw.WIDE_DECODE if bits == 4 else iw.WIDE_DECODE8
    m_all = ip.PANEL_MIN_ROWS - 1 if ip.PANEL_MIN_ROWS > 1 else 31
    a = np.zeros((m_all, nb * 32), np.float32)
    a[:, :k] = (rng.standard_normal((m_all, k)) * rng.choice([0.1, 1.0, 30.0], (m_all, k)))
    alone = np.empty((m_all, n), np.float32)
    for r in range(m_all):
        serial(a[r:r + 1], p.qi, p.scales, p.dz, alone[r:r + 1])
    want, mag = integer_reference(a, b.reshape(n, -1), s, zp, bits)
    assert np.all(np.abs(alone - want) <= 1e-5 * mag + 1e-30)
    for m in (2, 3, 5, 7, 8, 9, 15, 16, m_all):
        got = np.empty((m, n), np.float32)
        serial(a[:m], p.qi, p.scales, p.dz, got)
        np.testing.assert_array_equal(got, alone[:m], err_msg=f"M={m}")
        par = np.empty((m, n), np.float32)
        nbk.set_num_threads(2)
        try:
            nbk._parallel(par_kernel, a[:m], p.qi, p.scales, p.dz, par, 3)
        finally:
            nbk.set_num_threads(None)
        np.testing.assert_array_equal(par, alone[:m], err_msg=f"M={m}, parallel")
        xq, sx, xsum = ci.quantize_rows(a[:m])
        wide = np.full((m, n + 40), np.nan, np.float32)
        view = wide[:, 20:20 + n]  # rows n + 40 floats apart
        t = np.zeros((max(1, m // 8), nb, 8), np.float32)
        it._cols(xq, sx, xsum, t, t, p.qi, p.scales, p.dz, view, 0, n, 1)
        np.testing.assert_array_equal(view, alone[:m], err_msg=f"M={m}, strided out")
        assert np.isnan(wide[:, :20]).all() and np.isnan(wide[:, 20 + n:]).all()
        if on:  # the wide tiles alone: columns 4 .. 4 + 16j, from a group start
            part = np.full((m, n), np.nan, np.float32)
            stop = iw._wide_cols(xq, sx, xsum, p.qi, p.scales, p.dz, part, 4, n - n % 4, 0)
            assert stop == 4 + (n - n % 4 - 4) // 16 * 16
            np.testing.assert_array_equal(part[:, 4:stop], alone[:m, 4:stop])
            assert np.isnan(part[:, :4]).all() and np.isnan(part[:, stop:]).all()
