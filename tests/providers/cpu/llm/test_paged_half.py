"""float16 KV pools (actorrt.providers.cpu.llm._half): the kernels' half <->
float32 conversions equal numpy's ``astype`` bit for bit, and
GroupQueryAttention on a float16 paged cache equals a numpy reference whose
keys and values are rounded to half."""

import numpy as np
import pytest

import actorrt
from actorrt.providers.cpu.llm import _contrib_numba as nbk
from actorrt.providers.cpu.llm.paged import PagedKVPool, PageTable
from tests.providers.cpu.llm.test_contrib_gqa import case
from tests.providers.cpu.llm.test_paged_attention import _model, _paged

pytestmark = pytest.mark.skipif(not nbk.HAVE_NUMBA, reason="the paged kernels need numba")

H, KVH, D = 4, 2, 16


def _half():
    from actorrt.providers.cpu.llm import _half
    return _half


def test_every_half_pattern_to_float32_equals_numpy():
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    got = np.empty(bits.shape, np.float32)
    _half().to_f32(bits, got)
    want = bits.view(np.float16).astype(np.float32)
    nan = np.isnan(want)
    assert nan.sum() == 2 * 1023  # both signs, every non-zero significand
    np.testing.assert_array_equal(got.view(np.uint32)[~nan], want.view(np.uint32)[~nan])
    # a NaN stays a NaN of the same sign (the hardware quiets a signalling one)
    assert np.isnan(got[nan]).all()
    assert (np.signbit(got[nan]) == np.signbit(want[nan])).all()


def _edge_floats() -> np.ndarray:
    # every half value, the midpoints between neighbours (round-to-even ties)
    # and one float32 ulp either side of them, subnormals, overflow, inf, nan
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    fin = np.sort(h[np.isfinite(h)].astype(np.float64))
    fin = np.unique(fin)
    mids = ((fin[1:] + fin[:-1]) / 2).astype(np.float32)  # exact in float32
    ups = np.nextafter(mids, np.float32(np.inf))
    downs = np.nextafter(mids, np.float32(-np.inf))
    big = np.array([65504, 65519.996, 65520, 65536, 1e6, 3.4e38, np.inf, -np.inf, np.nan,
                    -np.nan, 2.0 ** -24, 2.0 ** -25, 2.0 ** -25 * 1.0000001, 2.0 ** -26, 1e-45,
                    -1e-45, 0.0, -0.0, 2.0 ** -14, 2.0 ** -14 * (1 - 2 ** -11)], np.float32)
    rng = np.random.default_rng(0)
    rand = rng.integers(0, 1 << 32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    return np.concatenate([fin.astype(np.float32), mids, ups, downs, big, rand])


def test_float32_to_half_equals_numpy_round_to_nearest_even():
    x = _edge_floats()
    got = np.empty(x.shape, np.uint16)
    _half().to_f16(x, got)
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)
    nan = np.isnan(x)
    np.testing.assert_array_equal(got[~nan], want.view(np.uint16)[~nan])
    back = got[nan].view(np.float16)
    assert np.isnan(back).all() and (np.signbit(back) == np.signbit(x[nan])).all()


def test_kv_get_and_kv_put_from_python_equal_the_compiled_ones():
    from numba import njit
    h = _half()

    @njit
    def put_all(row, x):
        for e in range(x.shape[0]):
            h.kv_put(row, e, x[e])

    @njit
    def get_all(row, out):
        for e in range(row.shape[0]):
            out[e] = h.kv_get(row, e)

    x = _edge_floats()[::97]
    x = x[~np.isnan(x)]
    for dtype in (np.uint16, np.float32):
        compiled, python = np.zeros(x.shape, dtype), np.zeros(x.shape, dtype)
        with np.errstate(over="ignore"):
            put_all(compiled, x)
            for e in range(x.shape[0]):
                h.kv_put(python, e, x[e])
        np.testing.assert_array_equal(python, compiled)
        with np.errstate(over="ignore"):
            want = (x.astype(np.float16).view(np.uint16) if dtype == np.uint16 else x)
        np.testing.assert_array_equal(python, want)
        got_c = np.empty(x.shape, np.float32)
        get_all(compiled, got_c)
        got_p = np.array([h.kv_get(python, e) for e in range(x.shape[0])], np.float32)
        np.testing.assert_array_equal(got_p.view(np.uint32), got_c.view(np.uint32))


def test_conversions_are_f16c_instructions():
    h = _half()
    if "avx2" not in open("/proc/cpuinfo").read():
        pytest.skip("no AVX2/F16C here")
    from numba import njit

    # uncached copies of the loops (cached code cannot be inspected)
    to32 = njit(h.to_f32.py_func)
    to16 = njit(h.to_f16.py_func)
    to32(np.zeros(4, np.uint16), np.zeros(4, np.float32))
    to16(np.zeros(4, np.float32), np.zeros(4, np.uint16))
    asm32 = to32.inspect_asm(to32.signatures[0])
    asm16 = to16.inspect_asm(to16.signatures[0])
    assert "vcvtph2ps" in asm32 and "vcvtps2ph" in asm16


def _rotate(x, cos, sin):
    # rotate-half (not interleaved) over the first 2 * cos.shape[-1] values
    r = cos.shape[-1]
    out = x.copy()
    x1, x2 = x[..., :r], x[..., r:2 * r]
    out[..., :r] = x1 * cos - x2 * sin
    out[..., r:2 * r] = x2 * cos + x1 * sin
    return out


def _reference(feeds, rotary, past_len):
    """GroupQueryAttention in float64 numpy with every cached and new key
    and value rounded to float16 (as the pool holds them)."""
    q = feeds["query"].astype(np.float64)
    bsz, s, _ = q.shape
    seqlens = feeds["seqlens_k"].astype(np.int64)
    tot = seqlens + 1
    half = lambda a: a.astype(np.float16).astype(np.float64)  # noqa: E731
    out = np.zeros((bsz, s, H * D))
    g = H // KVH
    for b in range(bsz):
        past = int(past_len[b])
        pos = past + np.arange(s)
        qb = q[b].reshape(s, H, D)
        kn = feeds["key"][b].astype(np.float32).reshape(s, KVH, D)
        vn = feeds["value"][b].reshape(s, KVH, D).astype(np.float64)
        if rotary:
            c, sn = feeds["cos_cache"][pos][:, None], feeds["sin_cache"][pos][:, None]
            qb = _rotate(qb, c.astype(np.float64), sn.astype(np.float64))
            kn = _rotate(kn, c, sn)  # float32, as the kernel rotates before rounding
        keys = np.concatenate([half(feeds["past_key"][b, :, :past].transpose(1, 0, 2)),
                               half(kn)], axis=0)  # (T, KVH, D)
        vals = np.concatenate([half(feeds["past_value"][b, :, :past].transpose(1, 0, 2)),
                               half(vn)], axis=0)
        for i in range(s):
            t = past + i
            if t >= tot[b]:
                continue
            for hh in range(H):
                kh = hh // g
                sc = keys[:t + 1, kh] @ qb[i, hh] / np.sqrt(D)
                w = np.exp(sc - sc.max())
                out[b, i, hh * D:(hh + 1) * D] = (w / w.sum()) @ vals[:t + 1, kh]
    return out, tot


HALF_CASES = {
    "decode": dict(b=3, s=1, past=12, seqlens=[3, 4, 9], total=10),
    "prompt": dict(b=2, s=7, past=0, seqlens=[6, 3], total=7),
    "chunk": dict(b=1, s=6, past=12, seqlens=[10], total=11),
    "long": dict(b=2, s=5, past=40, seqlens=[37, 44], total=45),
}


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("rotary", [False, True])
@pytest.mark.parametrize("name", sorted(HALF_CASES))
async def test_float16_paged_attention_equals_a_half_rounding_reference(name, rotary,
                                                                         block_size):
    rng = np.random.default_rng(11)
    feeds = case(rng, h=H, kvh=KVH, d=D, rotary=rotary, **HALF_CASES[name])
    model = _model(feeds, **({"do_rotary": 1} if rotary else {}))
    seqlens = feeds["seqlens_k"].astype(np.int64)
    s, total = feeds["query"].shape[1], int(feeds["total_sequence_length"])
    tot = seqlens + 1
    past = np.zeros_like(tot) if s == total else tot - s
    want, _ = _reference(feeds, rotary, past)
    bsz = len(tot)
    pools, gather, _ = _paged(feeds, block_size, rng, spare=2, dtype=np.float16)
    async with actorrt.open_session(model) as sess:
        got = await sess.run(None, {**feeds, **pools}, donate=["past_key", "past_value"])
    assert got[1] is pools["past_key"] and got[1].dtype == np.float16
    for b in range(bsz):
        rows = min(s, int(tot[b]))
        np.testing.assert_allclose(got[0][b, :rows], want[b, :rows], rtol=1e-5, atol=1e-5)
        # the new values were written rounded to half (values are not rotated)
        for i in range(s):
            t = int(past[b]) + i
            if t < tot[b]:
                row = gather(pools["past_value"], b)[:, t]
                np.testing.assert_array_equal(
                    row, feeds["value"][b, i].reshape(KVH, D).astype(np.float16))


async def test_pools_of_two_dtypes_are_refused():
    rng = np.random.default_rng(2)
    feeds = case(rng, h=H, kvh=KVH, d=D, b=1, s=1, past=4, seqlens=[4], total=5)
    model = _model(feeds)
    pages = PageTable()
    pages.table = np.array([[0, 1]], np.int32)
    kp = PagedKVPool.wrap(np.zeros((2, KVH, 4, D), np.float16), pages)
    vp = PagedKVPool.wrap(np.zeros((2, KVH, 4, D), np.float32), pages)
    async with actorrt.open_session(model) as sess:
        with pytest.raises(actorrt.KernelError, match="GroupQueryAttention"):
            await sess.run(None, {**feeds, "past_key": kp, "past_value": vp},
                           donate=["past_key", "past_value"])


def _decode_reference(q, keys, vals, tot, window, g, d):
    """float64 decode attention: q (B, H*D), keys/vals (B, KVH, T, D) float64,
    each row b attends positions [max(0, T_b - window), T_b) (all: window 0)."""
    bsz = q.shape[0]
    heads = q.shape[1] // d
    out = np.zeros((bsz, heads * d))
    for b in range(bsz):
        lo = max(0, tot[b] - window) if window > 0 else 0
        for hh in range(heads):
            kh = hh // g
            sc = keys[b, kh, lo:tot[b]] @ q[b, hh * d:(hh + 1) * d] / np.sqrt(d)
            w = np.exp(sc - sc.max())
            out[b, hh * d:(hh + 1) * d] = (w / w.sum()) @ vals[b, kh, lo:tot[b]]
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("window", [0, 3, 6, 13])
def test_decode_rows_of_mixed_lengths_equal_float64_on_the_pool_values(dtype, block_size,
                                                                       window):
    # one query row per batch row, context lengths on and around the decode
    # kernel's groups of four positions and the blocks (1, 6, 17, 39, 70
    # attended positions; a window moves the first one off a group start):
    # a float16 pool against float64 on its half values, a float32 pool also
    # bit for bit against the contiguous cache's kernel
    from actorrt.providers.cpu.llm import _paged_kernels as pk

    rng = np.random.default_rng(5)
    h, kvh, d = 6, 2, 16
    seqlens = np.array([0, 5, 16, 38, 69], np.int64)
    bsz, tot = len(seqlens), seqlens + 1
    cap = int(tot.max())
    nb = -(-cap // block_size)
    keys = rng.standard_normal((bsz, kvh, nb * block_size, d)).astype(dtype)
    vals = rng.standard_normal((bsz, kvh, nb * block_size, d)).astype(dtype)
    q = rng.standard_normal((bsz, 1, h * d)).astype(np.float32)
    kn = rng.standard_normal((bsz, 1, kvh * d)).astype(np.float32)
    vn = rng.standard_normal((bsz, 1, kvh * d)).astype(np.float32)
    # the pools: batch row b's blocks in a shuffled order
    order = rng.permutation(bsz * nb)
    table = order.reshape(bsz, nb).astype(np.int32)
    kpool = np.zeros((bsz * nb, kvh, block_size, d), dtype)
    vpool = np.zeros_like(kpool)
    for b in range(bsz):
        for j in range(nb):
            kpool[table[b, j]] = keys[b, :, j * block_size:(j + 1) * block_size]
            vpool[table[b, j]] = vals[b, :, j * block_size:(j + 1) * block_size]
    got, status = pk.gqa_paged(q, kn, vn, kpool, vpool, table, seqlens, cap, None, None, None,
                               num_heads=h, kv_num_heads=kvh, alpha=1.0 / np.sqrt(d),
                               window=window, interleaved=False)
    assert status == 0
    # the reference's cache: the pools' values, the new row appended (rounded
    # as the pool stores it)
    k64 = keys.astype(np.float64)
    v64 = vals.astype(np.float64)
    for b in range(bsz):
        k64[b, :, seqlens[b]] = kn[b, 0].reshape(kvh, d).astype(dtype)
        v64[b, :, seqlens[b]] = vn[b, 0].reshape(kvh, d).astype(dtype)
    want = _decode_reference(q[:, 0].astype(np.float64), k64, v64, tot, window, h // kvh, d)
    np.testing.assert_allclose(got[:, 0], want, rtol=1e-5, atol=1e-5)
    if dtype == np.float32:  # the contiguous cache: the same kernel, the same bits
        pk_c = np.ascontiguousarray(keys)
        pv_c = np.ascontiguousarray(vals)
        out, status = nbk.gqa_attention(q, kn, vn, pk_c, pv_c, pk_c, pv_c, seqlens, cap, None,
                                        None, None, num_heads=h, kv_num_heads=kvh,
                                        copy_past=False, alpha=1.0 / np.sqrt(d),
                                        window=window, interleaved=False)
        assert status == 0
        np.testing.assert_array_equal(out, got)
