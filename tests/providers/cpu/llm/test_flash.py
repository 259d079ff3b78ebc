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
from tests.providers.cpu.llm.test_contrib_gqa import case, gqa_model
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


def _feeds(rng, s, past, h=H, kvh=KVH, d=D):
    total = past + s
    return case(rng, h=h, kvh=kvh, d=d, rotary=True, b=1, s=s, past=past,
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


# head widths and group sizes (onnxruntime takes multiples of 16): 48 (the
# P.V product in one block of 48 columns) with 2 query heads a KV head,
# SmolLM2's 64 with its 3, 128 (two 64-column blocks) with 5 (TQ * 5 query
# rows: 64-column blocks of the scores and a tail block)
SHAPES = {"d48-g2": (4, 2, 48), "d64-g3": (9, 3, 64), "d128-g5": (5, 1, 128)}


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("name", ["3tk+5", "chunk", "window"])
async def test_tiled_widths_equal_onnxruntime(shape, name):
    h, kvh, d = SHAPES[shape]
    c = CASES[name]
    rng = np.random.default_rng(11)
    feeds = _feeds(rng, c["s"], c["past"], h, kvh, d)
    attrs = {"do_rotary": 1, "num_heads": h, "kv_num_heads": kvh,
             **({"local_window_size": c["window"]} if c["window"] else {})}
    model = gqa_model(feeds, **attrs)
    want = run_onnxruntime(model, {k: v.copy() for k, v in feeds.items()})
    async with actorrt.open_session(model) as sess:
        got = await sess.run(None, {k: v.copy() for k, v in feeds.items()})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-6)


def _reference(feeds, h, kvh, window=0):
    """numpy float64 causal (windowed) GQA with rotary (halves), one batch
    row: (S, H * D)."""
    q, k, v = (feeds[n][0].astype(np.float64) for n in ("query", "key", "value"))
    s = q.shape[0]
    past = feeds["past_key"].shape[2]
    d = q.shape[1] // h
    cos, sin = (feeds[n].astype(np.float64) for n in ("cos_cache", "sin_cache"))

    def rot(x, p):  # (S, heads, D) at positions p
        c, sn = cos[p][:, None, :], sin[p][:, None, :]
        a, b = x[..., :d // 2], x[..., d // 2:]
        return np.concatenate([a * c - b * sn, b * c + a * sn], -1)
    pos = np.arange(past, past + s)
    qh = rot(q.reshape(s, h, d), pos)
    keys = np.concatenate([feeds["past_key"][0].transpose(1, 0, 2).astype(np.float64),
                           rot(k.reshape(s, kvh, d), pos)])
    vals = np.concatenate([feeds["past_value"][0].transpose(1, 0, 2).astype(np.float64),
                           v.reshape(s, kvh, d)])
    out = np.empty((s, h, d))
    for i in range(s):
        t = past + i + 1
        lo = max(0, t - window) if window else 0
        for hh in range(h):
            kh = hh // (h // kvh)
            sc = keys[lo:t, kh] @ qh[i, hh] / np.sqrt(d)
            w = np.exp(sc - sc.max())
            out[i, hh] = (w / w.sum()) @ vals[lo:t, kh]
    return out.reshape(s, h * d)


@pytest.mark.parametrize("name", ["3tk+5", "window"])
async def test_tiled_padded_width_equals_float64(name):
    # a head width not a multiple of the tiles' 16 lanes (padded with
    # zeros; onnxruntime refuses it): numpy float64 is the peer
    h, kvh, d = 6, 2, 24
    c = CASES[name]
    rng = np.random.default_rng(12)
    feeds = _feeds(rng, c["s"], c["past"], h, kvh, d)
    attrs = {"do_rotary": 1, "num_heads": h, "kv_num_heads": kvh,
             **({"local_window_size": c["window"]} if c["window"] else {})}
    async with actorrt.open_session(gqa_model(feeds, **attrs)) as sess:
        got = await sess.run(None, {k: v.copy() for k, v in feeds.items()})
    np.testing.assert_allclose(got[0][0], _reference(feeds, h, kvh, c["window"]),
                               rtol=1e-4, atol=1e-4)


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
