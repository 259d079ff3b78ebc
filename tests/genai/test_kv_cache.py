"""The engine on its block-paged KV cache (actorrt.genai.kv_cache): greedy ids
equal the contiguous layout's for concurrent requests of mixed and
block-boundary lengths (chunked and batched prefill, joins and leaves mid
decode), memory follows the tokens held, and a soak with cancellations
returns every block and every accounted byte."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import trio

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from actorrt.genai import SamplingParams, open_engine as _open_engine  # noqa: E402
from actorrt.genai.kv_cache import BLOCK_SIZE, KVCache  # noqa: E402
from actorrt.genai.models import prepare_model  # noqa: E402
from actorrt.providers._memory import MemoryAccountant  # noqa: E402
from actorrt.providers.cpu.llm import _contrib_numba as nbk  # noqa: E402
from tests.genai.test_builder import write_tiny_gguf  # noqa: E402

#: these tests size KV budgets in float32 bytes a token and compare the paged
#: layout with the contiguous one (float32 only): a float32 cache, not the
#: float16 one the engine picks at accuracy level 4 (tests/genai/test_kv_half.py)
open_engine = functools.partial(_open_engine, kv_dtype="float32")

pytestmark = pytest.mark.skipif(not nbk.HAVE_NUMBA, reason="the paged kernels need numba")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("paged")
    return prepare_model(write_tiny_gguf(tmp / "tiny.gguf"), home=tmp / "home", progress=False)


def _prompt(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 280, n).tolist()


# prompt lengths on and around block boundaries (16), and a few short ones
# that arrive together (one batched prefill run)
LENGTHS = [15, 16, 17, 1, 32, 33, 3, 5, 48]


async def _serve(folder, layout: str, arrivals: list[tuple[float, int, int]], **kw):
    """token ids per request: (arrival delay s, prompt length, new tokens)."""
    got: dict[int, list[int]] = {}
    async with open_engine(folder, kv_layout=layout, **kw) as engine:
        async def one(i, delay, n, new):
            await trio.sleep(delay)
            r = await engine.generate(_prompt(n, i), SamplingParams(max_new_tokens=new,
                                                                    ignore_eos=True))
            got[i] = r.token_ids

        async with trio.open_nursery() as nursery:
            for i, (delay, n, new) in enumerate(arrivals):
                nursery.start_soon(one, i, delay, n, new)
        while engine.statistics().kv_bytes:  # the last run ends (a step at most)
            await trio.sleep(0.005)
        st = engine.statistics()
        assert st.active == st.waiting == st.kv_bytes == 0 and st.kv_blocks_used == 0
        mem = engine.session._providers[0].statistics().memory
        assert mem.live_by_role["kv-cache"] == 0
    return got, st


@pytest.mark.parametrize("chunk", [8, 64])
async def test_paged_equals_contiguous_greedy_ids(tiny_dir, chunk):
    # joins and leaves mid decode: staggered arrivals, different lengths out
    arrivals = [(0.01 * (i % 4), n, 6 + 3 * (i % 5)) for i, n in enumerate(LENGTHS)]
    with trio.fail_after(300):
        want, st0 = await _serve(tiny_dir, "contiguous", arrivals, max_batch=6,
                                 prefill_chunk=chunk)
        got, st = await _serve(tiny_dir, "paged", arrivals, max_batch=6, prefill_chunk=chunk)
    assert got == want
    assert st.kv_blocks_total > 0 and st0.kv_blocks_total == 0
    assert max(st.batch_histogram) > 1  # requests really decoded side by side


async def test_memory_follows_the_tokens_held(tiny_dir):
    # a request allowed 100 new tokens holds the blocks of its tokens so far,
    # never its capacity (the contiguous layout reserves prompt + 100)
    async with open_engine(tiny_dir, kv_layout="paged") as engine:
        engine.decode_run_steps = 1  # every step through the event loop
        seen = []
        prompt = _prompt(5, 0)
        async for piece in engine.stream(prompt, SamplingParams(max_new_tokens=100,
                                                               ignore_eos=True), details=True):
            st = engine.statistics()
            seen.append((len(seen) + 1, st.kv_blocks_used, st.kv_bytes))
        block_bytes = engine.bytes_per_token * BLOCK_SIZE
        for n, blocks, nbytes in seen:
            # the token just sampled is not in the cache yet: prompt + n - 1
            # positions written, blocks for one more taken by the next step
            assert blocks <= -(-(5 + n + 1) // BLOCK_SIZE) and nbytes == blocks * block_bytes
        # the 100th token finished the request: its blocks were already back
        assert seen[0][1] == 1 and seen[-1][1] == 0
        assert max(b for _, b, _ in seen) == -(-(5 + 99) // BLOCK_SIZE)


async def test_soak_with_cancellations_returns_every_block(tiny_dir):
    rng = np.random.default_rng(4)
    done = {"cancelled": 0, "finished": 0}
    async with open_engine(tiny_dir, kv_layout="paged", max_batch=16, prefill_chunk=16) as engine:
        cpu = engine.session._providers[0]
        baseline = cpu.statistics().memory.live_bytes

        async def one(i):
            await trio.sleep(float(rng.exponential(0.01)))
            n = int(rng.integers(1, 60))
            new = int(rng.integers(4, 40))
            cut = int(rng.integers(1, new)) if rng.random() < 0.25 else None
            params = SamplingParams(max_new_tokens=new, ignore_eos=True)
            k = 0
            async for _ in engine.stream(_prompt(n, i), params, details=True):
                k += 1
                if cut is not None and k >= cut:
                    done["cancelled"] += 1
                    return  # leaving the loop cancels the request
            done["finished"] += 1

        with trio.fail_after(300):
            async with trio.open_nursery() as nursery:
                for i in range(64):
                    nursery.start_soon(one, i)
            # the last cancels are reaped at a step boundary, and the blocks of
            # a request that left during a run are returned when the run ends
            while engine.statistics().active or engine.statistics().kv_bytes:
                await trio.sleep(0.01)
        st = engine.statistics()
        assert done["cancelled"] + done["finished"] == 64 and done["cancelled"] >= 8
        assert st.kv_blocks_used == 0 and st.kv_bytes == 0
        mem = cpu.statistics().memory
        assert mem.live_by_role["kv-cache"] == 0 and mem.live_bytes == baseline


def test_block_manager_free_list_and_accounting():
    acc = MemoryAccountant("cpu")
    cache = KVCache(["k", "v"], 2, 8, 6, memory=acc, block_size=4)
    a, b = [], []
    cache.grow(a, 5)  # 2 blocks
    cache.grow(b, 4)  # 1 block
    cache.grow(a, 8)  # still 2
    assert len(a) == 2 and len(b) == 1 and cache.free_blocks == 3
    assert acc.statistics().live_by_role["kv-cache"] == 3 * cache.block_bytes == cache.used_bytes
    feeds = cache.bind([a, b], 7)
    assert list(feeds) == ["k", "v"] and feeds["k"] is cache.pools[0]
    np.testing.assert_array_equal(cache.pages.table, [[a[0], a[1]], [b[0], -1]])
    with pytest.raises(Exception, match="free blocks"):
        cache.grow(b, 4 * 5)  # 4 more needed, 3 free: nothing taken
    assert len(b) == 1 and cache.free_blocks == 3
    cache.release(a)
    assert a == [] and cache.free_blocks == 5
    c = []
    cache.grow(c, 1)
    assert c[0] in (0, 1)  # a freed block is reused first
    cache.release(b)
    cache.release(c)
    assert cache.free_blocks == 6 and acc.statistics().live_by_role["kv-cache"] == 0


async def test_preemption_under_block_pressure_resumes_with_the_same_ids(tiny_dir):
    # a budget of 10 blocks for four requests that each grow to 4 blocks:
    # admitted by what they hold, the newest is preempted when the pool runs
    # dry mid decode and recomputed later; every request gets the ids it gets
    # with room to spare, and a request that can never fit is refused
    import actorrt

    arrivals = [(0.0, 20 + i, 40) for i in range(4)]
    with trio.fail_after(300):
        want, _ = await _serve(tiny_dir, "paged", arrivals)
        block_bytes = 2 * 2 * 2 * 16 * 4 * BLOCK_SIZE  # tiny: 2 layers, 2 KV heads, D 16
        got, st = await _serve(tiny_dir, "paged", arrivals, kv_budget_bytes=10 * block_bytes)
    assert got == want
    assert st.preemptions > 0 and st.kv_blocks_total == 10
    async with open_engine(tiny_dir, kv_budget_bytes=6 * block_bytes) as engine:
        # 100 + 100 tokens, capped at the context (128): 8 blocks
        with pytest.raises(actorrt.GenerationError, match="budget"):
            await engine.generate(_prompt(100, 0), SamplingParams(max_new_tokens=100))
        r = await engine.generate(_prompt(10, 0), SamplingParams(max_new_tokens=5))
        assert len(r.token_ids) >= 1  # it still serves


async def _sequential(folder, prompts, new=12, **kw):
    out = []
    async with open_engine(folder, kv_layout="paged", **kw) as engine:
        for p in prompts:
            r = await engine.generate(p, SamplingParams(max_new_tokens=new, ignore_eos=True))
            out.append(r.token_ids)
        while engine.statistics().kv_bytes:
            await trio.sleep(0.005)
        st = engine.statistics()
    return out, st


async def test_prefix_caching_shares_full_blocks_and_recomputes_where_prompts_diverge(tiny_dir):
    system = _prompt(40, 100)  # 2 full blocks and 8 positions
    a = system + _prompt(5, 1)
    b = system + _prompt(9, 2)
    c = system[:20] + _prompt(30, 3)  # diverges inside block 1
    prompts = [a, b, c, a, system[:32] + [7]]
    with trio.fail_after(120):
        want, st0 = await _sequential(tiny_dir, prompts, prefix_caching=False)
        got, st = await _sequential(tiny_dir, prompts)
    assert got == want
    assert st0.prefix_hits == 0 and st0.kv_blocks_cached == 0
    # b: blocks 0-1; c: block 0 (block 1 diverges: recomputed privately);
    # a again: blocks 0-1 (its own third block was not full); the last: 0-1
    assert st.prefix_hits == 4 and st.prefix_tokens_skipped == (2 + 1 + 2 + 2) * BLOCK_SIZE
    assert st.kv_blocks_used == 0 and st.kv_bytes == 0 and st.kv_blocks_cached > 0


async def test_prefix_cache_evicts_idle_blocks_lru_under_the_budget(tiny_dir):
    # 8 blocks of pool: every new prompt needs blocks that cached ones hold
    block_bytes = 2 * 2 * 2 * 16 * 4 * BLOCK_SIZE
    prompts = [_prompt(33, 10 + i) for i in range(6)] + [_prompt(33, 15)]
    with trio.fail_after(120):
        want, _ = await _sequential(tiny_dir, prompts, prefix_caching=False,
                                    kv_budget_bytes=8 * block_bytes)
        async with open_engine(tiny_dir, kv_budget_bytes=8 * block_bytes) as engine:
            got = []
            for p in prompts:
                r = await engine.generate(p, SamplingParams(max_new_tokens=12, ignore_eos=True))
                got.append(r.token_ids)
            cache = engine._cache
            assert cache.evictions > 0
            st = engine.statistics()
    assert got == want
    assert st.prefix_hits == 1  # the last prompt repeats the one before (still cached)


def test_prefix_blocks_are_reference_counted():
    acc = MemoryAccountant("cpu")
    cache = KVCache(["k", "v"], 1, 4, 4, memory=acc, block_size=2)
    tokens = [5, 6, 7, 8, 9]
    a = []
    cache.grow(a, 5)  # 3 blocks
    cache.register(a, tokens, 5)  # 2 full blocks registered
    assert cache.cached_blocks == 2
    b = []
    assert cache.share_prefix(b, tokens) == 4 and b == a[:2]  # one token left to compute
    c = []
    assert cache.share_prefix(c, [5, 6, 0, 8, 9]) == 2 and c == a[:1]  # diverges in block 1
    assert cache.used_blocks == 3 and acc.statistics().live_by_role["kv-cache"] == 3 * cache.block_bytes
    cache.release(a)  # its third block is free; the shared ones stay held by b and c
    assert cache.used_blocks == 2
    cache.release(b)
    cache.release(c)
    assert cache.used_blocks == 0 and acc.statistics().live_by_role["kv-cache"] == 0
    assert cache.cached_blocks == 2  # idle, still cached
    d = []
    assert cache.share_prefix(d, tokens) == 4  # taken back from the idle list
    assert cache.used_blocks == 2
    cache.release(d)
    e = []
    cache.grow(e, 6)  # 3 blocks: the 2 free ones, then the least recent idle one
    assert cache.evictions == 1 and cache.cached_blocks == 1 and cache.free_blocks == 1
    cache.release(e)
    assert cache.free_blocks == 4 and acc.statistics().live_by_role["kv-cache"] == 0


async def test_variant_blocks_on_a_paged_cache_equal_the_contiguous_layout(tmp_path, monkeypatch):
    # gemma3's fused variant blocks (turned on) meet the paged pools: they
    # hand the block to the original kernels, which read the block table
    from actorrt.providers.cpu.llm import _contrib_int8, _fusion_variants
    from tests.genai.test_archs import CASES, write_arch_gguf

    if not _contrib_int8.HAVE_INT8_DOT:
        pytest.skip("the variant blocks need the int8 kernels (AVX2)")
    monkeypatch.setattr(_fusion_variants, "VARIANT_BLOCKS", True)
    src = write_arch_gguf(tmp_path / "gemma3.gguf", **CASES["gemma3"])
    folder = prepare_model(src, home=tmp_path / "home", progress=False)
    arrivals = [(0.01 * i, n, 5) for i, n in enumerate((3, 17, 9))]
    with trio.fail_after(600):
        want, _ = await _serve(folder, "contiguous", arrivals, max_batch=4)
        got, _ = await _serve(folder, "paged", arrivals, max_batch=4)
    assert got == want
