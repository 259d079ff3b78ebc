"""Tiled causal prompt attention (actorrt.providers.cpu.llm._flash), through
GroupQueryAttention's prompt path: prompts on and across the query tile
(TQ) and key tile (TK) boundaries, a chunk after cached positions, a
sliding window and a right-padded batch give onnxruntime's results within
1e-4, on a contiguous cache and (bit for bit the contiguous results) on a
paged one; a prompt computed in two chunks gives the whole prompt's rows
bit for bit (query tiles are aligned to absolute positions: a row is
computed at the same place in its tile whatever the chunk)."""

import numpy as np
import pytest

import actorrt
from actorrt.providers.cpu.llm import _contrib_numba as nbk
from actorrt.providers.cpu.llm import _flash
from tests.oracle import run_onnxruntime
from tests.providers.cpu.llm.test_contrib_gqa import case
from tests.providers.cpu.llm.test_paged_attention import _model, _paged

pytestmark = pytest.mark.skipif(not nbk.HAVE_NUMBA, reason="the tiled kernel needs numba")

H, KVH, D = 4, 2, 16
TQ, TK = _flash.TQ, _flash.TK

CASES = {
    # a first prompt: one key tile less one, exactly one, one more; three
    # key tiles and a part (every query tile count from 4 to 13)
    "tk-1": dict(s=TK - 1, past=0, window=0),
    "tk": dict(s=TK, past=0, window=0),
    "tk+1": dict(s=TK + 1, past=0, window=0),
    "3tk+5": dict(s=3 * TK + 5, past=0, window=0),
    # a prefill chunk after cached positions (starts inside key tile 1)
    "chunk": dict(s=TQ * 2 + 7, past=TK + 6, window=0),
    # a sliding window: the key tiles below it are skipped
    "window": dict(s=3 * TK + 5, past=0, window=TK // 2 + 3),
}


def _feeds(rng, s, past):
    total = past + s
    return case(rng, h=H, kvh=KVH, d=D, rotary=True, b=1, s=s, past=past,
                seqlens=[total - 1], total=total, max_pos=total + 1)


@pytest.mark.parametrize("name", sorted(CASES))
async def test_tiled_prompt_attention_equals_onnxruntime(name):
    c = CASES[name]
    rng = np.random.default_rng(7)
    feeds = _feeds(rng, c["s"], c["past"])
    attrs = {"do_rotary": 1, **({"local_window_size": c["window"]} if c["window"] else {})}
    model = _model(feeds, **attrs)
    want = run_onnxruntime(model, {k: v.copy() for k, v in feeds.items()})
    pools, gather, _ = _paged(feeds, 16, rng)
    async with actorrt.open_session(model) as sess:
        got = await sess.run(None, {k: v.copy() for k, v in feeds.items()})
        paged = await sess.run(None, {**feeds, **pools}, donate=["past_key", "past_value"])
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(paged[0], got[0])
    np.testing.assert_allclose(gather(paged[1], 0), want[1][0], rtol=1e-5, atol=1e-6)


async def test_right_padded_batch_equals_onnxruntime():
    # two rows, one ending inside the first key tile: its padded query
    # rows are unspecified, its real ones match
    rng = np.random.default_rng(8)
    s = TK + 9
    feeds = case(rng, h=H, kvh=KVH, d=D, rotary=True, b=2, s=s, past=0,
                 seqlens=[s - 1, TQ + 2], total=s, max_pos=s + 1)
    model = _model(feeds, do_rotary=1)
    want = run_onnxruntime(model, {k: v.copy() for k, v in feeds.items()})
    async with actorrt.open_session(model) as sess:
        got = await sess.run(None, feeds)
    np.testing.assert_allclose(got[0][0], want[0][0], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got[0][1, :TQ + 3], want[0][1, :TQ + 3], rtol=1e-4, atol=1e-4)


async def test_two_chunks_give_the_whole_prompts_bits():
    rng = np.random.default_rng(9)
    s, cut = 2 * TK + 3, TK - 5  # the cut inside a query tile and a key tile
    feeds = _feeds(rng, s, 0)
    first = {k: v.copy() for k, v in feeds.items()}
    second = {k: v.copy() for k, v in feeds.items()}
    for k in ("query", "key", "value"):
        first[k] = feeds[k][:, :cut].copy()
        second[k] = feeds[k][:, cut:].copy()
    first["seqlens_k"] = np.asarray([cut - 1], np.int32)
    first["total_sequence_length"] = np.asarray(cut, np.int32)
    async with actorrt.open_session(_model(feeds, do_rotary=1)) as sess:
        whole = await sess.run(None, feeds)
    async with actorrt.open_session(_model(first, do_rotary=1)) as sess:
        part1 = await sess.run(None, first)
    second["past_key"], second["past_value"] = part1[1], part1[2]
    async with actorrt.open_session(_model(second, do_rotary=1)) as sess:
        part2 = await sess.run(None, second)
    np.testing.assert_array_equal(part1[0][0], whole[0][0, :cut])
    np.testing.assert_array_equal(part2[0][0], whole[0][0, cut:])
