"""``actorrt serve`` driven over HTTP on 127.0.0.1 with the official
``openai`` client (sync and async) and httpx: one engine, two apps (an open
one, and one with an API key and no queue), shared by the module's tests;
SIGINT against a real ``actorrt serve`` process."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import trio

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("hypercorn")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

import actorrt  # noqa: E402

KEY = "sekrit-key"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server(model_dir):
    """(open URL, keyed URL) of two apps over one engine, in a thread."""
    from hypercorn.config import Config
    from hypercorn.trio import serve

    from actorrt.genai import open_engine
    from actorrt.serve import create_app

    box: dict = {}
    ready = threading.Event()

    async def main():
        stop = trio.Event()
        box["stop"], box["token"] = stop, trio.lowlevel.current_trio_token()
        async with open_engine(model_dir, max_batch=16) as engine:
            apps = [create_app(engine, model_id="smollm2"),
                    create_app(engine, model_id="smollm2", api_key=KEY, max_queue=0)]
            async with trio.open_nursery() as nursery:
                urls = []
                for app in apps:
                    config = Config()
                    config.bind = ["127.0.0.1:0"]
                    config.accesslog = None
                    config.graceful_timeout = 1.0
                    urls += await nursery.start(
                        lambda task_status, app=app, config=config: serve(
                            app, config, shutdown_trigger=stop.wait, task_status=task_status))
                box["urls"] = urls
                ready.set()

    def run():
        try:
            trio.run(main)
        except BaseException as exc:  # noqa: BLE001 - reported to the fixture
            box["error"] = exc
            ready.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    ready.wait(600)
    if "error" in box:
        raise box["error"]
    yield box["urls"]
    trio.from_thread.run_sync(box["stop"].set, trio_token=box["token"])
    thread.join(30)


def _client(url, **kw):
    return openai.OpenAI(base_url=url + "/v1", api_key=kw.pop("api_key", "none"),
                         max_retries=0, timeout=120, **kw)


def _metrics(url) -> dict:
    text = httpx.get(url + "/metrics", timeout=60).text
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _value(m: dict, name: str, **labels) -> float:
    return m.get((name, tuple(sorted(labels.items()))), 0.0)


PROMPTS = ["The capital of France is", "Once upon a time", "The best way to learn is",
           "In 1969, humans", "Water boils at", "My favourite food is",
           "The meaning of life is", "Computers are"]


def test_models_health_and_routes(server):
    url, keyed = server
    models = _client(url).models.list()
    assert [m.id for m in models.data] == ["smollm2"]
    assert httpx.get(url + "/v1/models/smollm2").json()["id"] == "smollm2"
    assert httpx.get(url + "/health").json() == {"status": "ok"}
    r = httpx.get(url + "/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"


def test_streamed_text_equals_the_non_streamed_text_greedy(server):
    url, _ = server
    client = _client(url)
    once = client.completions.create(model="smollm2", prompt=PROMPTS[0], max_tokens=10,
                                      temperature=0)
    streamed = list(client.completions.create(model="smollm2", prompt=PROMPTS[0], max_tokens=10,
                                              temperature=0, stream=True,
                                              stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in streamed if c.choices)
    assert text == once.choices[0].text and "Paris" in text
    assert once.choices[0].finish_reason == streamed[-2].choices[0].finish_reason == "length"
    assert once.usage.prompt_tokens == 5 and once.usage.completion_tokens == 10
    assert streamed[-1].usage.total_tokens == 15 and not streamed[-1].choices
    # chat, through the model's template
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    chat = client.chat.completions.create(model="smollm2", messages=msgs, max_tokens=12,
                                          temperature=0)
    parts = list(client.chat.completions.create(model="smollm2", messages=msgs, max_tokens=12,
                                                temperature=0, stream=True))
    assert parts[0].choices[0].delta.role == "assistant"
    assert "".join(p.choices[0].delta.content or "" for p in parts) == \
        chat.choices[0].message.content
    assert chat.usage.prompt_tokens > 20  # the template's system prompt
    # content parts and max_completion_tokens
    parts_msgs = [{"role": "user", "content": [{"type": "text", "text": "What is the capital "},
                                               {"type": "text", "text": "of France?"}]}]
    same = client.chat.completions.create(model="smollm2", messages=parts_msgs,
                                          max_completion_tokens=12, temperature=0)
    assert same.choices[0].message.content == chat.choices[0].message.content


def test_stop_seed_n_penalties_and_logprobs(server):
    url, _ = server
    client = _client(url)
    stop = client.completions.create(model="smollm2", prompt=PROMPTS[0], max_tokens=20,
                                      temperature=0, stop=["."])
    assert stop.choices[0].finish_reason == "stop" and "." not in stop.choices[0].text
    a = client.completions.create(model="smollm2", prompt=PROMPTS[1], max_tokens=8, seed=11,
                                  temperature=1.0, n=3)
    b = client.completions.create(model="smollm2", prompt=PROMPTS[1], max_tokens=8, seed=11,
                                  temperature=1.0, n=3)
    assert [c.index for c in a.choices] == [0, 1, 2]
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    assert len({c.text for c in a.choices}) > 1  # derived seeds differ
    assert a.usage.prompt_tokens == 4  # the prompt once, as OpenAI counts it
    assert a.usage.completion_tokens == 24
    plain = client.completions.create(model="smollm2", prompt="One, two, one, two, one,",
                                      max_tokens=8, temperature=0)
    pen = client.completions.create(model="smollm2", prompt="One, two, one, two, one,",
                                    max_tokens=8, temperature=0, frequency_penalty=2.0,
                                    presence_penalty=1.0)
    assert pen.choices[0].text != plain.choices[0].text
    lp = client.chat.completions.create(model="smollm2", messages=[
        {"role": "user", "content": "Hi"}], max_tokens=4, temperature=0, logprobs=True,
        top_logprobs=3)
    content = lp.choices[0].logprobs.content
    assert len(content) == lp.usage.completion_tokens or len(content) == 4
    for e in content:
        assert e.logprob <= 0 and len(e.top_logprobs) == 3
        assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob >= e.top_logprobs[2].logprob
        assert e.token == e.top_logprobs[0].token  # greedy picks the most likely
        assert abs(e.logprob - e.top_logprobs[0].logprob) < 1e-9
    comp = client.completions.create(model="smollm2", prompt=PROMPTS[0], max_tokens=3,
                                      temperature=0, logprobs=2)
    assert "".join(comp.choices[0].logprobs.tokens) == comp.choices[0].text
    assert comp.choices[0].logprobs.text_offset[0] == 0


def test_sixteen_concurrent_streams_get_their_solo_tokens(server):
    url, _ = server
    prompts = [PROMPTS[i % 8] + ("" if i < 8 else " really") for i in range(16)]

    async def main():
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0,
                                    timeout=300)
        solo = [(await client.completions.create(model="smollm2", prompt=p, max_tokens=6,
                                                 temperature=0)).choices[0].text
                for p in prompts]

        async def one(p):
            stream = await client.completions.create(model="smollm2", prompt=p, max_tokens=6,
                                                     temperature=0, stream=True)
            return "".join([c.choices[0].text async for c in stream if c.choices])

        together = await asyncio.gather(*(one(p) for p in prompts))
        await client.close()
        return solo, together

    solo, together = asyncio.run(main())
    assert together == solo


def test_a_client_dropped_mid_stream_returns_kv_bytes_to_baseline(server):
    url, _ = server
    body = {"model": "smollm2", "prompt": PROMPTS[1], "max_tokens": 400, "temperature": 0,
            "stream": True}
    assert _value(_metrics(url), "actorrt_kv_cache_bytes") == 0
    with httpx.Client(timeout=120) as http:
        with http.stream("POST", url + "/v1/completions", json=body) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            got = [next(lines) for _ in range(6)]
            assert any(x.startswith("data: ") for x in got)
            assert _value(_metrics(url), "actorrt_kv_cache_bytes") > 0
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        m = _metrics(url)
        if (_value(m, "actorrt_kv_cache_bytes") == 0
                and _value(m, "actorrt_requests_running") == 0):
            break
        time.sleep(0.05)
    assert _value(m, "actorrt_kv_cache_bytes") == 0
    assert _value(m, "actorrt_requests_running") == 0


BAD = [  # (body, status, param, code); posted to /v1/completions unless chat
    (b"{not json", 400, None, None),
    (b"[1, 2]", 400, None, None),
    ({"prompt": "x"}, 400, "model", None),
    ({"model": "gpt-9", "prompt": "x"}, 404, "model", "model_not_found"),
    ({"model": "smollm2"}, 400, "prompt", None),
    ({"model": "smollm2", "prompt": 5}, 400, "prompt", None),
    ({"model": "smollm2", "prompt": "x", "temperature": "hot"}, 400, "temperature", None),
    ({"model": "smollm2", "prompt": "x", "temperature": 2.5}, 400, "temperature", None),
    ({"model": "smollm2", "prompt": "x", "top_p": 0}, 400, "top_p", None),
    ({"model": "smollm2", "prompt": "x", "max_tokens": 0}, 400, "max_tokens", None),
    ({"model": "smollm2", "prompt": "x", "max_tokens": True}, 400, "max_tokens", None),
    ({"model": "smollm2", "prompt": "x", "n": 0}, 400, "n", None),
    ({"model": "smollm2", "prompt": "x", "seed": -1}, 400, "seed", None),
    ({"model": "smollm2", "prompt": "x", "stop": 3}, 400, "stop", None),
    ({"model": "smollm2", "prompt": "x", "presence_penalty": 3}, 400, "presence_penalty", None),
    ({"model": "smollm2", "prompt": "x", "logprobs": 9}, 400, "logprobs", None),
    ({"model": "smollm2", "prompt": "x", "stream": "yes"}, 400, "stream", None),
    ({"model": "smollm2", "prompt": "x", "stream_options": {"include_usage": True}}, 400,
     "stream_options", None),
    ({"model": "smollm2", "prompt": [10**9]}, 400, "prompt", None),
    ({"model": "smollm2", "prompt": "x", "max_tokens": 8192}, 400, "max_tokens",
     "context_length_exceeded"),
    ({"model": "smollm2", "prompt": "hello " * 8200}, 400, "prompt", "context_length_exceeded"),
    ("chat", {"model": "smollm2", "messages": []}, 400, "messages", None),
    ("chat", {"model": "smollm2", "messages": [{"role": "robot", "content": "x"}]}, 400,
     "messages[0].role", None),
    ("chat", {"model": "smollm2", "messages": [{"role": "user", "content": 7}]}, 400,
     "messages[0].content", None),
    ("chat", {"model": "smollm2", "messages": [{"role": "user", "content": "x"}],
              "top_logprobs": 2}, 400, "top_logprobs", None),
    ("chat", {"model": "smollm2", "messages": [{"role": "user", "content": "x"}],
              "logprobs": True, "top_logprobs": 21}, 400, "top_logprobs", None),
]


@pytest.mark.parametrize("case", BAD, ids=lambda c: json.dumps(c[-4] if c[0] == "chat" else
                                                               c[0], default=str)[:60])
def test_bad_requests_get_their_status_and_openai_error(server, case):
    url, _ = server
    path = "/v1/completions"
    if case[0] == "chat":
        path, case = "/v1/chat/completions", case[1:]
    body, status, param, code = case
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(url + path, content=content, headers={"content-type": "application/json"},
                   timeout=60)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"] and err["type"]
    assert err["param"] == param and err["code"] == code


def test_api_key_and_a_full_queue(server):
    _, keyed = server
    body = {"model": "smollm2", "prompt": "x", "max_tokens": 2}
    r = httpx.post(keyed + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = httpx.post(keyed + "/v1/completions", json=body, headers={"Authorization": "Bearer no"},
                   timeout=60)
    assert r.status_code == 401
    with pytest.raises(openai.AuthenticationError):
        _client(keyed, api_key="wrong").models.list()
    assert [m.id for m in _client(keyed, api_key=KEY).models.list().data] == ["smollm2"]
    # max_queue=0: a request holding all 16 batch slots leaves no room
    auth = {"Authorization": f"Bearer {KEY}"}
    big = {"model": "smollm2", "prompt": PROMPTS[1], "max_tokens": 200, "temperature": 0,
           "n": 16, "stream": True}
    with httpx.Client(timeout=120) as http:
        with http.stream("POST", keyed + "/v1/completions", json=big, headers=auth) as r:
            assert r.status_code == 200
            lines = r.iter_lines()  # kept: a dropped iterator closes the connection
            next(lines)
            t0 = time.monotonic()
            busy = httpx.post(keyed + "/v1/completions", json=body, headers=auth, timeout=120)
            print(f"429 answered in {time.monotonic() - t0:.2f} s")
            assert busy.status_code == 429 and busy.headers["retry-after"] == "1"
            assert busy.json()["error"]["type"] == "rate_limit_error"
            with pytest.raises(openai.RateLimitError):
                _client(keyed, api_key=KEY).completions.create(**body)
    # the dropped stream freed its slots
    deadline = time.monotonic() + 30
    while True:
        ok = httpx.post(keyed + "/v1/completions", json=body, headers=auth, timeout=120)
        if ok.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert ok.status_code == 200


def test_metrics_parse_and_count_the_traffic(server):
    url, _ = server
    before = _metrics(url)
    client = _client(url)
    replies = [client.completions.create(model="smollm2", prompt=PROMPTS[i], max_tokens=3,
                                         temperature=0) for i in range(2)]
    usage = [r.usage for r in replies]
    reasons = [r.choices[0].finish_reason for r in replies]
    chunks = list(client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
        temperature=0, stream=True, stream_options={"include_usage": True}))
    usage.append(chunks[-1].usage)
    reasons.append(chunks[-2].choices[0].finish_reason)
    assert httpx.post(url + "/v1/completions", content=b"{", timeout=60).status_code == 400
    after = _metrics(url)

    def delta(name, **labels):
        return _value(after, name, **labels) - _value(before, name, **labels)

    assert delta("actorrt_requests_total", endpoint="/v1/completions", status="200") == 2
    assert delta("actorrt_requests_total", endpoint="/v1/completions", status="400") == 1
    assert delta("actorrt_requests_total", endpoint="/v1/chat/completions", status="200") == 1
    assert delta("actorrt_requests_total", endpoint="/metrics", status="200") == 1
    assert delta("actorrt_prompt_tokens_total") == sum(u.prompt_tokens for u in usage)
    assert delta("actorrt_generation_tokens_total") == sum(u.completion_tokens for u in usage)
    assert delta("actorrt_time_to_first_token_seconds_count") == 3
    # one gap between successive text tokens; an EOS (finish "stop" without
    # stop strings) counts in usage but is not streamed
    assert delta("actorrt_inter_token_latency_seconds_count") == sum(
        u.completion_tokens - 1 - (why == "stop") for u, why in zip(usage, reasons))
    assert _value(after, "actorrt_requests_queued") == 0


def test_sigint_while_streaming_exits_0_without_a_traceback(model_dir):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "actorrt.serve.cli", "--model", str(model_dir),
                             "--port", "0", "--grace", "300"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert " on http://127.0.0.1:" in line, line + proc.stderr.read()
        url = line.rsplit(" on ", 1)[1].strip()
        name = httpx.get(url + "/v1/models", timeout=60).json()["data"][0]["id"]
        assert name == model_dir.name
        body = {"model": name, "prompt": PROMPTS[1], "max_tokens": 6, "temperature": 0,
                "stream": True}
        with httpx.Client(timeout=300) as http:
            with http.stream("POST", url + "/v1/completions", json=body) as r:
                lines = r.iter_lines()
                first = next(lines)
                assert first.startswith("data: ")
                proc.send_signal(signal.SIGINT)
                rest = list(lines)  # the request in flight finishes
        assert "data: [DONE]" in rest
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "stopped" in err
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/health")
