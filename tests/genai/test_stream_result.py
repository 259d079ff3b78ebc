"""Streams tell how they ended (issue #19 item 6) and the sampling features
the OpenAI API needs: the stream's result, structured pieces, an aborted
stream raising, no U+FFFD after a cut inside a character, log-probabilities
and presence / frequency penalties against onnxruntime's logits, and the
seeds of ``n`` choices."""

from __future__ import annotations

import json

import numpy as np
import pytest
import trio

import actorrt
from actorrt.genai import SamplingParams, open_engine
from actorrt.genai.engine import StreamPiece
from actorrt.genai.sampling import Sampler

pytest.importorskip("tokenizers")

PROMPT = "The capital of France is"


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64)
    m = z.max(-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(-1, keepdims=True))


_ORT: dict = {}


def _ort_logits(model_dir, ids: list[int]) -> np.ndarray:
    """onnxruntime's logits (seq, vocab) of model.onnx over ``ids`` (no past)."""
    ort = pytest.importorskip("onnxruntime")
    layers = json.loads((model_dir / "genai_config.json").read_text())["model"]["num_layers"]
    if model_dir not in _ORT:
        so = ort.SessionOptions()
        so.intra_op_num_threads = 2
        _ORT[model_dir] = ort.InferenceSession(str(model_dir / "model.onnx"), so,
                                               providers=["CPUExecutionProvider"])
    sess = _ORT[model_dir]
    feeds = {"input_ids": np.asarray([ids], np.int64),
             "attention_mask": np.ones((1, len(ids)), np.int64)}
    for i in range(layers):
        for k in ("key", "value"):
            feeds[f"past_key_values.{i}.{k}"] = np.zeros((1, 3, 0, 64), np.float32)
    return sess.run(["logits"], feeds)[0][0]


async def test_stream_result_and_pieces_equal_generate(model_dir):
    params = SamplingParams(max_new_tokens=10)
    async with open_engine(model_dir) as engine:
        want = await engine.generate(PROMPT, params)
        stream = engine.stream(PROMPT, params)
        assert stream.result is None
        text = "".join([p async for p in stream])
        detailed = engine.stream(PROMPT, params, details=True)
        pieces = [p async for p in detailed]
        with pytest.raises(actorrt.InvalidArgumentError):
            engine.stream(PROMPT, params, details="yes")
    assert stream.result == detailed.result == want or (
        stream.result.token_ids == want.token_ids == detailed.result.token_ids)
    assert text == want.text
    assert stream.result.finish_reason == want.finish_reason
    assert stream.result.prompt_tokens == 5
    assert all(isinstance(p, StreamPiece) for p in pieces)
    assert "".join(p.text for p in pieces) == want.text
    ids = [t for p in pieces for t in p.token_ids]
    assert ids == [t for t in want.token_ids if t not in engine.eos]
    assert all(p.logprobs is None for p in pieces)


async def test_a_stream_cut_by_the_engine_closing_raises(model_dir):
    seen = trio.Event()
    outcome = {}

    async def reader(engine):
        stream = engine.stream("Once upon a time", SamplingParams(max_new_tokens=400,
                                                                  ignore_eos=True))
        n = 0
        try:
            async for _ in stream:
                n += 1
                if n == 3:
                    seen.set()
        except actorrt.SessionClosedError as exc:
            outcome["error"] = exc
        outcome["result"] = stream.result

    async def waiter(engine):  # a request still queued when the engine closes
        try:
            await engine.generate("Hello", SamplingParams(max_new_tokens=400))
        except actorrt.SessionClosedError as exc:
            outcome["queued"] = exc

    async with trio.open_nursery() as outer:
        async with open_engine(model_dir, max_batch=1) as engine:
            outer.start_soon(reader, engine)
            await seen.wait()
            outer.start_soon(waiter, engine)
            await trio.sleep(0.05)
    assert "closed before the request finished" in str(outcome["error"])
    assert outcome["result"] is None
    assert isinstance(outcome["queued"], actorrt.SessionClosedError)
    with pytest.raises(actorrt.SessionClosedError):
        await engine.generate(PROMPT, SamplingParams(max_new_tokens=2))


async def test_a_cut_inside_a_character_drops_its_bytes_not_fffd(model_dir):
    prompt = "日本語のテキスト：東京は"
    async with open_engine(model_dir) as engine:
        full = await engine.generate(prompt, SamplingParams(max_new_tokens=16, ignore_eos=True))
        raw = [engine.tokenizer.token_bytes(t) for t in full.token_ids]
        # cuts where the bytes so far end inside a character (python's codec)
        cuts = []
        for k in range(1, len(raw) + 1):
            try:
                b"".join(raw[:k]).decode("utf-8")
            except UnicodeDecodeError:
                cuts.append(k)
        assert cuts, "the continuation splits no character; pick another prompt"
        for k in cuts[:2]:
            stream = engine.stream(prompt, SamplingParams(max_new_tokens=k, ignore_eos=True))
            text = "".join([p async for p in stream])
            data = b"".join(raw[:k])
            want = data.decode("utf-8", errors="ignore")
            # the complete characters are kept, the split one dropped
            assert stream.result.finish_reason == "length"
            assert text == stream.result.text == want
            assert not text.endswith("\ufffd")
            assert want.encode() == data[:len(want.encode())]


async def test_logprobs_are_onnxruntimes_log_softmax(model_dir):
    params = SamplingParams(max_new_tokens=6, logprobs=5, ignore_eos=True)
    async with open_engine(model_dir, accuracy_level=0) as engine:
        prompt = engine.encode_prompt(PROMPT)
        stream = engine.stream(prompt, params, details=True)
        pieces = [p async for p in stream]
    ids = stream.result.token_ids
    lps = [lp for p in pieces for lp in (p.logprobs or ())]
    assert [lp.token_id for lp in lps] == ids
    ref = _log_softmax(_ort_logits(model_dir, prompt + ids))
    for i, lp in enumerate(lps):
        row = ref[len(prompt) - 1 + i]
        assert abs(lp.logprob - row[ids[i]]) < 2e-3
        assert ids[i] == int(row.argmax())  # greedy
        top = np.argsort(-row, kind="stable")[:5]
        assert [t for t, _ in lp.top] == top.tolist()
        np.testing.assert_allclose([v for _, v in lp.top], row[top], atol=2e-3)


async def test_presence_and_frequency_penalties_follow_openai(model_dir):
    fp, pp = 1.5, 0.7
    params = SamplingParams(max_new_tokens=8, ignore_eos=True, frequency_penalty=fp,
                            presence_penalty=pp)
    async with open_engine(model_dir, accuracy_level=0) as engine:
        prompt = engine.encode_prompt("One, two, one, two, one, two,")
        got = await engine.generate(prompt, params)
        plain = await engine.generate(prompt, SamplingParams(max_new_tokens=8, ignore_eos=True))
    # greedy decoding of onnxruntime's logits with OpenAI's rule applied by hand:
    # logit[j] -= count_j * frequency_penalty + (count_j > 0) * presence_penalty
    out: list[int] = []
    for _ in range(8):
        row = _ort_logits(model_dir, prompt + out)[-1].astype(np.float64)
        for t in set(out):
            row[t] -= out.count(t) * fp + pp
        out.append(int(row.argmax()))
    assert got.token_ids == out
    assert got.token_ids != plain.token_ids  # the penalty changed the reply


def test_sampler_penalties_logprobs_and_choice_seeds():
    logits = np.array([3.0, 2.9, 1.0, -1.0], np.float32)
    s = Sampler(SamplingParams(frequency_penalty=0.5, presence_penalty=0.2, logprobs=2))
    picks = [s(logits, []) for _ in range(4)]
    # 0 (3.0) -> 2.3 < 2.9: 1 -> 2.2 < 2.3: 0 -> 1.8 < 2.2: 1
    assert picks == [0, 1, 0, 1]
    # the third pick saw logits 3.0-0.7, 2.9-0.7: its log-probabilities
    z = np.array([2.3, 2.2, 1.0, -1.0])
    want = z - np.log(np.exp(z).sum())
    lp = s.logprobs[2]
    assert lp.token_id == 0 and abs(lp.logprob - want[0]) < 1e-6
    assert [t for t, _ in lp.top] == [0, 1]
    np.testing.assert_allclose([v for _, v in lp.top], want[:2], atol=1e-6)
    # penalties out of OpenAI's range, logprobs out of [0, 20]
    for bad in (dict(presence_penalty=2.5), dict(frequency_penalty=-3), dict(logprobs=21),
                dict(logprobs=-1), dict(logprobs=1.5), dict(presence_penalty=float("nan"))):
        with pytest.raises(actorrt.GenerationError):
            SamplingParams(**bad)
    # n choices: choice 0 keeps the seed, others derive distinct reproducible ones
    p = SamplingParams(temperature=1.0, seed=7)
    seeds = [p.for_choice(i).seed for i in range(4)]
    assert seeds[0] == 7 and len(set(seeds)) == 4
    assert seeds == [p.for_choice(i).seed for i in range(4)]
    assert SamplingParams(temperature=1.0).for_choice(3).seed is None
    assert SamplingParams().plain_argmax and not SamplingParams(logprobs=0).plain_argmax
