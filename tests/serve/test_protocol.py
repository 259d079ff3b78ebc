"""The OpenAI request parsing, without a server: accepted shapes, defaults,
and the field each refusal names."""

from __future__ import annotations

import pytest

pytest.importorskip("starlette")

from actorrt.serve.protocol import APIError, parse_chat, parse_completion  # noqa: E402


def test_completion_prompt_shapes_and_defaults():
    r = parse_completion({"model": "m", "prompt": "hi"})
    assert (r.prompts, r.n, r.stream, r.max_tokens, r.logprobs) == (["hi"], 1, False, None, None)
    assert r.sampling["temperature"] == 1.0 and r.sampling["stop"] == ()
    assert parse_completion({"model": "m", "prompt": ["a", "b"]}).prompts == ["a", "b"]
    assert parse_completion({"model": "m", "prompt": [1, 2]}).prompts == [[1, 2]]
    assert parse_completion({"model": "m", "prompt": [[1], [2, 3]]}).prompts == [[1], [2, 3]]
    r = parse_completion({"model": "m", "prompt": "x", "stop": "END", "n": 3, "seed": 4,
                          "stream": True, "stream_options": {"include_usage": True},
                          "max_completion_tokens": 7, "logprobs": 2})
    assert r.sampling["stop"] == ("END",) and r.n == 3 and r.sampling["seed"] == 4
    assert r.include_usage and r.max_tokens == 7 and r.logprobs == 2
    p = r.params(7)
    assert p.max_new_tokens == 7 and p.logprobs == 2 and p.stop == ("END",)


def test_chat_messages_parts_and_logprobs():
    r = parse_chat({"model": "m", "messages": [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None}], "logprobs": True, "top_logprobs": 3})
    assert r.prompts == [[{"role": "system", "content": "be brief"},
                          {"role": "user", "content": "ab"},
                          {"role": "assistant", "content": ""}]]
    assert r.logprobs == 3
    assert parse_chat({"model": "m", "messages": [{"role": "user", "content": "x"}],
                       "logprobs": True}).logprobs == 0


@pytest.mark.parametrize("body, param", [
    ({"model": "m", "prompt": "x", "top_p": 1.5}, "top_p"),
    ({"model": "m", "prompt": "x", "temperature": float("nan")}, "temperature"),
    ({"model": "m", "prompt": "x", "n": 17}, "n"),
    ({"model": "m", "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"model": "m", "prompt": "x", "stop": [""]}, "stop"),
    ({"model": "m", "prompt": "x", "echo": True}, "echo"),
    ({"model": "m", "prompt": "x", "logit_bias": {"1": 5}}, "logit_bias"),
    ({"model": "m", "prompt": "x", "best_of": 3}, "best_of"),
    ({"model": "m", "prompt": "x", "max_tokens": 4, "max_completion_tokens": 5},
     "max_completion_tokens"),
    ({"model": "m", "prompt": ""}, "prompt"),
    ({"model": "m", "prompt": [[]]}, "prompt"),
    ({"model": "m", "prompt": "x", "ignore_eos": 1}, "ignore_eos"),
    ({"model": 3, "prompt": "x"}, "model"),
])
def test_completion_refusals_name_the_field(body, param):
    with pytest.raises(APIError) as info:
        parse_completion(body)
    assert info.value.status == 400 and info.value.param == param


def test_chat_refusals_name_the_field():
    for body, param in [
        ({"model": "m", "messages": "hi"}, "messages"),
        ({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
         "messages[0].content"),
        ({"model": "m", "messages": [{"content": "x"}]}, "messages[0].role"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}],
          "response_format": {"type": "json_object"}}, "response_format"),
    ]:
        with pytest.raises(APIError) as info:
            parse_chat(body)
        assert info.value.param == param
