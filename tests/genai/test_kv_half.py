"""The engine's float16 KV cache (``kv_dtype="float16"``) and the prefix
cache's generated-token blocks: pools of IEEE half values hold half the
bytes; prefix sharing, preemption and chunked prefill on them give the ids
of the unshared, unpreempted float16 run; a finished request's generated
tokens' full blocks serve a follow-up turn whose prompt is its prompt + its
answer, with the uncached ids."""

from __future__ import annotations

import numpy as np
import pytest
import trio

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

import actorrt  # noqa: E402
from actorrt.genai import SamplingParams, open_engine  # noqa: E402
from actorrt.genai.kv_cache import BLOCK_SIZE, KVCache  # noqa: E402
from actorrt.providers._memory import MemoryAccountant  # noqa: E402
from actorrt.providers.cpu.llm import _contrib_numba as nbk  # noqa: E402
# the tiny GGUF model (module-scoped fixture) and seeded prompts of the paged tests
from tests.genai.test_kv_cache import _prompt, tiny_dir  # noqa: E402,F401

pytestmark = pytest.mark.skipif(not nbk.HAVE_NUMBA, reason="the paged kernels need numba")


async def _sequential(folder, prompts, new=12, **kw):
    out = []
    async with open_engine(folder, kv_layout="paged", **kw) as engine:
        for p in prompts:
            r = await engine.generate(p, SamplingParams(max_new_tokens=new, ignore_eos=True))
            out.append(r.token_ids)
        while engine.statistics().kv_bytes:
            await trio.sleep(0.005)
        st = engine.statistics()
        pool = engine._cache.pools[0]
    return out, st, pool


def test_float16_blocks_are_half_the_bytes():
    acc = MemoryAccountant("cpu")
    c32 = KVCache(["k", "v"], 2, 8, 4, memory=acc, block_size=4)
    c16 = KVCache(["k", "v"], 2, 8, 4, memory=acc, block_size=4, dtype=np.float16)
    assert c16.block_bytes * 2 == c32.block_bytes
    assert c16.pools[0].dtype == np.float16 and c16.pools[0].nbytes * 2 == c32.pools[0].nbytes
    blocks: list[int] = []
    c16.grow(blocks, 5)
    assert acc.statistics().live_by_role["kv-cache"] == 2 * c16.block_bytes
    c16.release(blocks)
    assert acc.statistics().live_by_role["kv-cache"] == 0
    with pytest.raises(actorrt.InvalidArgumentError, match="dtype"):
        KVCache(["k", "v"], 2, 8, 4, memory=acc, dtype=np.float64)


@pytest.mark.parametrize("level", [4, 0])
async def test_float16_engine_statistics_halve_and_prefix_sharing_keeps_the_ids(tiny_dir,
                                                                                level):
    system = _prompt(40, 100)
    prompts = [system + _prompt(5, 1), system + _prompt(9, 2), system[:20] + _prompt(30, 3)]
    with trio.fail_after(180):
        ids32, st32, _ = await _sequential(tiny_dir, prompts, accuracy_level=level,
                                           kv_dtype="float32", prefix_caching=False)
        want, st0, pool = await _sequential(tiny_dir, prompts, accuracy_level=level,
                                            kv_dtype="float16", prefix_caching=False)
        got, st, _ = await _sequential(tiny_dir, prompts, accuracy_level=level,
                                       kv_dtype="float16", prefill_chunk=8)
    assert pool.dtype == np.float16
    assert got == want  # shared blocks and 8-token chunks: the unshared run's ids
    assert st.prefix_hits == 2 and st.prefix_tokens_skipped == 3 * BLOCK_SIZE
    assert st0.kv_blocks_total == st32.kv_blocks_total
    assert len(ids32) == len(want)  # (ids may differ from float32's: rounded K/V)


async def test_float16_preemption_resumes_with_the_same_ids(tiny_dir):
    block_bytes16 = 2 * 2 * 2 * 16 * 2 * BLOCK_SIZE  # tiny: 2 layers, 2 KV heads, D 16
    arrivals = [_prompt(12 + 5 * i, 50 + i) for i in range(4)]

    async def serve(**kw):
        got = {}
        async with open_engine(tiny_dir, kv_dtype="float16", max_batch=4, **kw) as engine:
            async def one(i, p):
                r = await engine.generate(p, SamplingParams(max_new_tokens=30, ignore_eos=True))
                got[i] = r.token_ids
            async with trio.open_nursery() as nursery:
                for i, p in enumerate(arrivals):
                    nursery.start_soon(one, i, p)
            st = engine.statistics()
        return got, st

    with trio.fail_after(180):
        want, _ = await serve(prefix_caching=False)
        got, st = await serve(kv_budget_bytes=10 * block_bytes16, prefix_caching=False)
    assert st.preemptions > 0
    assert got == want


async def test_the_default_kv_dtype_follows_the_accuracy_level(tiny_dir):
    # level 4 (int8 activations, the default for a model we built): float16
    # pools; level 0 (onnxruntime-identical logits) and the contiguous layout:
    # float32; an explicit kv_dtype is kept
    cases = [({}, np.float16), ({"accuracy_level": 4}, np.float16),
             ({"accuracy_level": 0}, np.float32), ({"kv_dtype": "float32"}, np.float32),
             ({"accuracy_level": 0, "kv_dtype": "float16"}, np.float16),
             ({"kv_layout": "contiguous"}, np.float32)]
    prompt = _prompt(9, 4)
    with trio.fail_after(300):
        for kw, want in cases:
            async with open_engine(tiny_dir, **kw) as engine:
                assert engine.kv_dtype == want, kw
                assert engine.bytes_per_token == 2 * 2 * 2 * 16 * np.dtype(want).itemsize
                if engine._cache is not None:
                    assert engine._cache.pools[0].dtype == want
                r = await engine.generate(prompt, SamplingParams(max_new_tokens=3,
                                                                 ignore_eos=True))
                assert len(r.token_ids) == 3


async def test_float16_needs_the_paged_layout(tiny_dir):
    with pytest.raises(actorrt.InvalidArgumentError, match="paged"):
        async with open_engine(tiny_dir, kv_dtype="float16", kv_layout="contiguous"):
            pass
    with pytest.raises(actorrt.InvalidArgumentError, match="kv_dtype"):
        async with open_engine(tiny_dir, kv_dtype="bfloat16"):
            pass


@pytest.mark.parametrize("kv_dtype", ["float32", "float16"])
async def test_a_follow_up_turn_reuses_the_answer_blocks(tiny_dir, kv_dtype):
    # turn 1: 20 prompt tokens + 30 generated -> 49 positions hold KV (the
    # last token's never computed): 3 full blocks, 2 of them holding answer
    first = _prompt(20, 7)
    with trio.fail_after(180):
        async with open_engine(tiny_dir, kv_dtype=kv_dtype) as engine:
            r1 = await engine.generate(first, SamplingParams(max_new_tokens=30, ignore_eos=True))
            second = first + r1.token_ids + _prompt(6, 8)  # + the next user turn
            r2 = await engine.generate(second, SamplingParams(max_new_tokens=10,
                                                              ignore_eos=True))
            st = engine.statistics()
        async with open_engine(tiny_dir, kv_dtype=kv_dtype, prefix_caching=False) as engine:
            w1 = await engine.generate(first, SamplingParams(max_new_tokens=30, ignore_eos=True))
            w2 = await engine.generate(second, SamplingParams(max_new_tokens=10,
                                                              ignore_eos=True))
    assert r1.token_ids == w1.token_ids and r2.token_ids == w2.token_ids
    assert st.prefix_hits == 1 and st.prefix_tokens_skipped == 3 * BLOCK_SIZE
