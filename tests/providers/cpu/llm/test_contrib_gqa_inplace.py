"""GroupQueryAttention appends to a donated past buffer in place (onnxruntime's
shared past/present buffer); without donation the caller's arrays are untouched."""

import numpy as np

import actorrt
from tests.oracle import assert_close, run_onnxruntime
from tests.providers.cpu.llm.test_contrib_gqa import case, gqa_model


def _feeds():
    rng = np.random.default_rng(7)
    # batch 2 with different lengths in a capacity-8 buffer, decoding one token
    return case(rng, b=2, s=1, past=8, seqlens=[5, 2], total=6, rotary=True)


async def test_without_donation_inputs_are_not_modified():
    feeds = _feeds()
    model = gqa_model(feeds, num_heads=4, kv_num_heads=2, do_rotary=1)
    before = feeds["past_key"].copy()
    async with actorrt.open_session(model) as s:
        got = await s.run(None, feeds)
    np.testing.assert_array_equal(feeds["past_key"], before)
    assert not np.shares_memory(got[1], feeds["past_key"])
    want = run_onnxruntime(model, feeds)
    assert_close(got[:1], want[:1], rtol=1e-4, atol=1e-5)
    for b, t in enumerate([6, 3]):  # valid prefix of each row
        np.testing.assert_allclose(got[1][b, :, :t], want[1][b, :, :t], rtol=1e-4, atol=1e-5)


async def test_donated_past_is_appended_in_place():
    feeds = _feeds()
    model = gqa_model(feeds, num_heads=4, kv_num_heads=2, do_rotary=1)
    want = run_onnxruntime(model, {k: v.copy() for k, v in feeds.items()})
    async with actorrt.open_session(model) as s:
        assert s.plan.donatable  # past_key/past_value feed an in-place kernel
        got = await s.run(None, feeds, donate=["past_key", "past_value"])
    assert got[1] is feeds["past_key"] or np.shares_memory(got[1], feeds["past_key"])
    assert_close(got[:1], want[:1], rtol=1e-4, atol=1e-5)
    for b, t in enumerate([6, 3]):
        np.testing.assert_allclose(got[1][b, :, :t], want[1][b, :, :t], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(got[2][b, :, :t], want[2][b, :, :t], rtol=1e-4, atol=1e-5)
