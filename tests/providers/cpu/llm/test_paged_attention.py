"""GroupQueryAttention on a block-paged KV cache (actorrt.providers.cpu.llm.paged):
the pools' rows scattered over shuffled blocks give what onnxruntime gives on
the contiguous cache, and what actorrt's contiguous kernel gives bit for bit."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import actorrt
from actorrt.providers.cpu.llm.paged import PagedKVPool, PageTable
from tests.oracle import run_onnxruntime
from tests.providers.cpu.llm.test_contrib_gqa import case

H, KVH, D = 4, 2, 16


def _model(feeds, **attrs):
    """A GroupQueryAttention model with symbolic batch / length dims (a pool
    of any block count and size can be fed as past)."""
    names = ["query", "key", "value", "past_key", "past_value", "seqlens_k",
             "total_sequence_length", "cos_cache", "sin_cache"]
    names = [n if n in feeds else "" for n in names]
    while names[-1] == "":
        names.pop()
    node = helper.make_node("GroupQueryAttention", names,
                            ["output", "present_key", "present_value"], domain="com.microsoft",
                            num_heads=H, kv_num_heads=KVH, **attrs)
    shapes = {"past_key": ["B", KVH, "L", D], "past_value": ["B", KVH, "L", D]}
    ins = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype),
                                         shapes.get(n, v.shape)) for n, v in feeds.items()]
    outs = [helper.make_tensor_value_info("output", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("present_key", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("present_value", TensorProto.FLOAT, None)]
    g = helper.make_graph([node], "gqa", ins, outs)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21),
                                               helper.make_opsetid("com.microsoft", 1)])


def _paged(feeds, block_size, rng, spare=3, dtype=np.float32):
    """(pools' feeds, gather, T_b): the past rows [0, P_b) of each row
    scattered over shuffled blocks of ``dtype`` with room for T_b positions;
    gather(pool, b) reads row b's positions back as (KVH, T_b, D)."""
    seqlens = feeds["seqlens_k"].astype(np.int64)
    s = feeds["query"].shape[1]
    total = int(feeds["total_sequence_length"])
    bsz = seqlens.shape[0]
    tot = seqlens + 1
    past = np.zeros_like(tot) if s == total else tot - s
    width = int(max(-(-int(t) // block_size) for t in np.maximum(tot, s)))
    n_blocks = bsz * width + spare
    order = rng.permutation(n_blocks)
    table = np.full((bsz, width), -1, np.int32)
    k = 0
    for b in range(bsz):
        for j in range(-(-int(tot[b]) // block_size)):
            table[b, j] = order[k]
            k += 1
    pages = PageTable()
    pages.table = table
    pools = {}
    for name in ("past_key", "past_value"):
        pool = rng.standard_normal((n_blocks, KVH, block_size, D)).astype(dtype)
        for b in range(bsz):
            for t in range(int(past[b])):
                pool[table[b, t // block_size], :, t % block_size] = feeds[name][b, :, t]
        pools[name] = PagedKVPool.wrap(pool, pages)

    def gather(pool, b):
        t_b = int(tot[b])
        return np.stack([pool[table[b, t // block_size], :, t % block_size]
                         for t in range(t_b)], axis=1)
    return pools, gather, tot


CASES = {
    # decode, three rows crossing block boundaries (block 4: 3, 4, 9 cached)
    "decode": dict(b=3, s=1, past=12, seqlens=[3, 4, 9], total=10),
    # first prompt, right-padded batch
    "prompt": dict(b=2, s=7, past=0, seqlens=[6, 3], total=7),
    # a prefill chunk after a cached part (past 5, chunk 6)
    "chunk": dict(b=1, s=6, past=12, seqlens=[10], total=11),
    "packed": dict(b=2, s=1, past=9, seqlens=[8, 2], total=9, packed=True),
}


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("rotary", [False, True])
@pytest.mark.parametrize("name", sorted(CASES))
async def test_paged_equals_contiguous(name, rotary, block_size):
    rng = np.random.default_rng(3)
    feeds = case(rng, h=H, kvh=KVH, d=D, rotary=rotary, **CASES[name])
    attrs = {"do_rotary": 1} if rotary else {}
    model = _model(feeds, **attrs)
    want = run_onnxruntime(model, {k: v.copy() for k, v in feeds.items()})
    pools, gather, tot = _paged(feeds, block_size, rng)
    async with actorrt.open_session(model) as sess:
        contiguous = await sess.run(None, {k: v.copy() for k, v in feeds.items()})
        got = await sess.run(None, {**feeds, **pools}, donate=["past_key", "past_value"])
    assert got[1] is pools["past_key"] and got[2] is pools["past_value"]
    s = feeds["query"].shape[1]
    for b in range(len(tot)):
        rows = min(s, int(tot[b]))  # padded query rows are unspecified
        np.testing.assert_allclose(got[0][b, :rows], want[0][b, :rows], rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(got[0][b, :rows], contiguous[0][b, :rows])
        for i in (1, 2):
            np.testing.assert_allclose(gather(got[i], b), want[i][b, :, :tot[b]],
                                       rtol=1e-5, atol=1e-6)


async def test_window_paged():
    rng = np.random.default_rng(5)
    feeds = case(rng, h=H, kvh=KVH, d=D, rotary=True, b=2, s=1, past=20, seqlens=[17, 9],
                 total=18)
    model = _model(feeds, do_rotary=1, local_window_size=5)
    want = run_onnxruntime(model, {k: v.copy() for k, v in feeds.items()})
    pools, _, _ = _paged(feeds, 4, rng)
    async with actorrt.open_session(model) as sess:
        got = await sess.run(None, {**feeds, **pools}, donate=["past_key", "past_value"])
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)


async def test_table_missing_a_block_is_a_kernel_error():
    rng = np.random.default_rng(1)
    feeds = case(rng, h=H, kvh=KVH, d=D, b=2, s=1, past=8, seqlens=[5, 7], total=8)
    pools, _, _ = _paged(feeds, 4, rng)
    pools["past_key"].pages.table[1, 1] = -1  # row 1's positions 4..7 have no block
    before = np.array(pools["past_key"])
    async with actorrt.open_session(_model(feeds)) as sess:
        with pytest.raises(actorrt.KernelError, match="block table"):
            await sess.run(None, {**feeds, **pools}, donate=["past_key", "past_value"])
    np.testing.assert_array_equal(np.array(pools["past_key"]), before)  # nothing written


async def test_pools_of_two_caches_are_refused():
    rng = np.random.default_rng(2)
    feeds = case(rng, h=H, kvh=KVH, d=D, b=1, s=1, past=4, seqlens=[3], total=4)
    pools, _, _ = _paged(feeds, 4, rng)
    other = PageTable()
    other.table = pools["past_key"].pages.table.copy()
    pools["past_value"] = PagedKVPool.wrap(np.array(pools["past_value"]), other)
    async with actorrt.open_session(_model(feeds)) as sess:
        with pytest.raises(actorrt.KernelError, match="paged cache"):
            await sess.run(None, {**feeds, **pools}, donate=["past_key", "past_value"])
