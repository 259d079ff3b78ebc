"""The ASGI app: Starlette routes over one :class:`~actorrt.genai.Engine`,
running on trio (hypercorn's trio worker; Starlette through anyio).

A generation request is checked (:mod:`.protocol`), its prompts tokenized in
a worker thread, and answered by a :class:`_GenerationResponse`: one engine
stream per choice in a nursery, merged into SSE chunks or one JSON body,
while a watcher cancels everything when the client disconnects (the engine
frees the requests' KV caches at its next step).
"""

from __future__ import annotations

import hmac
import json
import math
import time
from typing import Any, Callable

import attrs
import trio
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .._errors import ActorRTError, GenerationError, InvalidArgumentError, SessionClosedError
from . import protocol as P
from .metrics import ServerMetrics

__all__ = ["create_app", "ServerState", "MAX_BODY_BYTES", "DEFAULT_MAX_QUEUE"]

#: largest request body read (bytes); more is answered 413
MAX_BODY_BYTES = 8 << 20
#: default ``max_queue``: engine requests that may wait beyond ``max_batch``
DEFAULT_MAX_QUEUE = 64
#: ``Retry-After`` (s) of a 429
RETRY_AFTER_S = 1


@attrs.define
class ServerState:
    """What the routes share.

    Attributes:
        engine: the generation engine (same trio loop).
        model_id: the id ``/v1/models`` lists; ``aliases`` are accepted too.
        api_key: required ``Authorization: Bearer`` token of ``/v1/*`` (None: open).
        max_queue: engine requests (one a choice) allowed beyond
            ``engine.max_batch`` before new requests get 429.
        outstanding: engine requests in flight from this server now.
        closing: set once shutdown began (``/health`` answers 503).
    """

    engine: Any
    model_id: str
    aliases: frozenset
    api_key: str | None
    max_queue: int
    metrics: ServerMetrics
    created: int = attrs.field(factory=P.now)
    outstanding: int = 0
    closing: bool = False


def create_app(engine, *, model_id: str = "smollm2", aliases: tuple[str, ...] = (),
               api_key: str | None = None, max_queue: int = DEFAULT_MAX_QUEUE) -> Callable:
    """The OpenAI-compatible ASGI app over ``engine`` (an open
    :class:`~actorrt.genai.Engine`, used from the same trio loop).

    Routes: ``GET /v1/models``, ``GET /v1/models/{id}``, ``POST
    /v1/completions``, ``POST /v1/chat/completions``, ``GET /health``,
    ``GET /metrics``. The returned app has ``.state.server``
    (:class:`ServerState`).

    Raises:
        InvalidArgumentError: ``max_queue`` < 0 or an empty ``api_key``.
    """
    if not isinstance(max_queue, int) or isinstance(max_queue, bool) or max_queue < 0:
        raise InvalidArgumentError("max_queue must be an integer >= 0", expected=">= 0",
                                   got=repr(max_queue))
    if api_key is not None and not api_key:
        raise InvalidArgumentError("api_key must not be empty", expected="a token", got="''")
    state = ServerState(engine, model_id, frozenset((model_id, *aliases)), api_key, max_queue,
                        ServerMetrics(engine.statistics))

    async def api_error(request: Request, exc: P.APIError) -> Response:
        return JSONResponse(P.error_body(exc), exc.status, headers=exc.headers)

    async def http_error(request: Request, exc: HTTPException) -> Response:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        err = P.APIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}",
                         type=kind, code="not_found" if exc.status_code == 404 else None)
        return JSONResponse(P.error_body(err), exc.status_code)

    async def models(request: Request) -> Response:
        _auth(state, request)
        return JSONResponse({"object": "list", "data": [_model_card(state)]})

    async def model(request: Request) -> Response:
        _auth(state, request)
        _check_model(state, request.path_params["model"], "model")
        return JSONResponse(_model_card(state))

    async def completions(request: Request) -> Response:
        return await _generation(state, request, P.parse_completion)

    async def chat(request: Request) -> Response:
        return await _generation(state, request, P.parse_chat)

    async def health(request: Request) -> Response:
        if state.closing:
            return JSONResponse({"status": "shutting down"}, 503)
        return JSONResponse({"status": "ok"})

    async def metrics(request: Request) -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    app = Starlette(routes=[
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model:path}", model, methods=["GET"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ], exception_handlers={P.APIError: api_error, HTTPException: http_error})
    app.state.server = state
    return _Counted(app, state)


class _Counted:
    """ASGI wrapper counting every HTTP response by path and status."""

    def __init__(self, app, state: ServerState):
        self.app = app
        self.state = state

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = [500]

        async def counting_send(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            self.state.metrics.count_request(scope.get("path", ""), status[0])


def _model_card(state: ServerState) -> dict:
    return {"id": state.model_id, "object": "model", "created": state.created,
            "owned_by": "actorrt", "max_model_len": state.engine.context}


def _auth(state: ServerState, request: Request) -> None:
    if state.api_key is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise P.APIError(401, "missing API key: send 'Authorization: Bearer <key>'",
                         code="invalid_api_key")
    if not hmac.compare_digest(token.strip().encode(), state.api_key.encode()):
        raise P.APIError(401, "incorrect API key", code="invalid_api_key")


def _check_model(state: ServerState, name: str, param: str) -> None:
    if name not in state.aliases:
        raise P.APIError(404, f"the model {name!r} does not exist; this server serves "
                              f"{state.model_id!r}", type="invalid_request_error",
                         param=param, code="model_not_found")


async def _read_json(request: Request) -> Any:
    size = int(request.headers.get("content-length") or 0)
    if size > MAX_BODY_BYTES:
        raise P.APIError(413, f"the request body exceeds {MAX_BODY_BYTES} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise P.APIError(413, f"the request body exceeds {MAX_BODY_BYTES} bytes")
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks))
    except (ValueError, UnicodeDecodeError) as exc:
        raise P.APIError(400, f"the request body is not valid JSON: {exc}") from None


@attrs.frozen
class _Job:
    index: int  # the choice's index in the response
    prompt: int  # which prompt
    ids: list[int]
    params: Any


async def _generation(state: ServerState, request: Request, parse) -> Response:
    t_arrival = time.perf_counter()
    _auth(state, request)
    req = parse(await _read_json(request))
    _check_model(state, req.model, "model")
    engine = state.engine
    prompt_param = "messages" if req.kind == "chat" else "prompt"
    jobs: list[_Job] = []
    prompt_lens: list[int] = []
    for k, prompt in enumerate(req.prompts):
        try:
            ids = await trio.to_thread.run_sync(engine.encode_prompt, prompt)
        except InvalidArgumentError as exc:
            raise P.APIError(400, str(exc), param=prompt_param) from None
        if not ids:
            raise P.APIError(400, "the prompt encodes to no tokens", param=prompt_param)
        room = engine.context - len(ids)
        if req.max_tokens is not None and len(ids) + req.max_tokens > engine.context:
            raise P.APIError(400, f"this model's context is {engine.context} tokens; the "
                                  f"request asks for {len(ids)} prompt tokens + "
                                  f"{req.max_tokens} completion tokens",
                             param="max_tokens", code="context_length_exceeded")
        if room < 1:
            raise P.APIError(400, f"this model's context is {engine.context} tokens; the "
                                  f"prompt has {len(ids)}", param=prompt_param,
                             code="context_length_exceeded")
        default = P.DEFAULT_CHAT_TOKENS if req.kind == "chat" else P.DEFAULT_COMPLETION_TOKENS
        max_new = req.max_tokens if req.max_tokens is not None else min(default, room)
        need = min(len(ids) + max_new, engine.context) * engine.bytes_per_token
        if engine.kv_budget is not None and need > engine.kv_budget:
            raise P.APIError(400, f"the request needs {need} bytes of KV cache; the server's "
                                  f"budget is {engine.kv_budget} bytes: lower max_tokens",
                             param="max_tokens", code="kv_budget_exceeded")
        params = req.params(max_new)
        prompt_lens.append(len(ids))
        for i in range(req.n):
            jobs.append(_Job(k * req.n + i, k, ids, params.for_choice(i)))
    if state.closing:
        raise P.APIError(503, "the server is shutting down", type="server_error",
                         code="shutting_down")
    if len(jobs) > engine.max_batch + state.max_queue:
        raise P.APIError(400, f"the request asks for {len(jobs)} choices; this server runs "
                              f"{engine.max_batch} + queues {state.max_queue} at most",
                         param="n")
    if state.outstanding + len(jobs) > engine.max_batch + state.max_queue:
        raise P.APIError(429, f"the server is busy ({state.outstanding} requests in flight, "
                              f"{engine.max_batch} running + {state.max_queue} queued at "
                              f"most); retry later", type="rate_limit_error",
                         code="queue_full", headers={"Retry-After": str(RETRY_AFTER_S)})
    state.outstanding += len(jobs)
    return _GenerationResponse(state, req, jobs, prompt_lens, t_arrival)


def _status_of(exc: BaseException) -> tuple[int, str, str | None]:
    if isinstance(exc, P.APIError):
        return exc.status, exc.type, exc.code
    if isinstance(exc, (GenerationError, InvalidArgumentError)):
        return 400, "invalid_request_error", None
    if isinstance(exc, SessionClosedError):
        return 503, "server_error", "shutting_down"
    return 500, "server_error", None


class _GenerationResponse:
    """Runs a request's choices and writes them to the client (ASGI)."""

    def __init__(self, state: ServerState, req: P.ParsedRequest, jobs: list[_Job],
                 prompt_lens: list[int], t_arrival: float):
        self.state = state
        self.req = req
        self.jobs = jobs
        self.prompt_lens = prompt_lens
        self.t_arrival = t_arrival
        self.id = P.new_id(req.kind)
        self.created = P.now()
        self.tokens = [0] * len(jobs)  # tokens each choice produced so far
        self.results: list = [None] * len(jobs)

    async def __call__(self, scope, receive, send) -> None:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch_disconnect, receive, nursery.cancel_scope)
                events_send, events = trio.open_memory_channel(math.inf)
                async with events_send:
                    for job in self.jobs:
                        nursery.start_soon(self._run_choice, job, events_send.clone())
                if self.req.stream:
                    await self._stream(events, send)
                else:
                    await self._once(events, send)
                nursery.cancel_scope.cancel()  # the watcher
        finally:
            self.state.outstanding -= len(self.jobs)
            m = self.state.metrics
            m.prompt_tokens.inc(sum(self.prompt_lens))
            m.generation_tokens.inc(sum(self.tokens))

    async def _watch_disconnect(self, receive, scope: trio.CancelScope) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                scope.cancel()  # the choices' engine requests are cancelled
                return

    async def _run_choice(self, job: _Job, events) -> None:
        engine = self.state.engine
        m = self.state.metrics
        async with events:
            last = None
            try:
                stream = engine.stream(job.ids, job.params, details=True)
                async for piece in stream:
                    if piece.token_ids:
                        now = time.perf_counter()
                        if last is None:
                            m.ttft.observe(now - self.t_arrival)
                        else:
                            m.itl.observe(now - last)
                        last = now
                        self.tokens[job.index] += len(piece.token_ids)
                    events.send_nowait(("piece", job.index, piece))
                self.results[job.index] = stream.result
                self.tokens[job.index] = len(stream.result.token_ids)
                events.send_nowait(("done", job.index, stream.result))
            except ActorRTError as exc:
                events.send_nowait(("error", job.index, exc))

    # ------------------------------------------------------------ one JSON
    async def _once(self, events, send) -> None:
        texts = [[] for _ in self.jobs]
        lps = [[] for _ in self.jobs]
        async for kind, index, item in events:
            if kind == "piece":
                texts[index].append(item.text)
                if item.logprobs:
                    lps[index].extend(item.logprobs)
            elif kind == "error":
                # the other choices are cancelled with the nursery
                status, typ, code = _status_of(item)
                err = P.APIError(status, str(item), type=typ, code=code)
                await self._send_json(send, status, P.error_body(err))
                return
        tb = self.state.engine.tokenizer.token_bytes
        choices = []
        for job in self.jobs:
            res = self.results[job.index]
            text = "".join(texts[job.index])
            if self.req.kind == "chat":
                choice = {"index": job.index,
                          "message": {"role": "assistant", "content": text},
                          "logprobs": (P.chat_logprobs(lps[job.index], tb)
                                       if self.req.logprobs is not None else None),
                          "finish_reason": res.finish_reason}
            else:
                choice = {"index": job.index, "text": text,
                          "logprobs": (P.completion_logprobs(lps[job.index], tb)
                                       if self.req.logprobs is not None else None),
                          "finish_reason": res.finish_reason}
            choices.append(choice)
        body = {"id": self.id, "object": "chat.completion" if self.req.kind == "chat"
                else "text_completion", "created": self.created, "model": self.req.model,
                "choices": choices, "usage": P.usage(sum(self.prompt_lens), sum(self.tokens))}
        await self._send_json(send, 200, body)

    async def _send_json(self, send, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data, "more_body": False})

    # ----------------------------------------------------------------- SSE
    def _chunk(self, choices: list[dict], usage: dict | None = None) -> bytes:
        body = {"id": self.id, "object": "chat.completion.chunk" if self.req.kind == "chat"
                else "text_completion", "created": self.created, "model": self.req.model,
                "choices": choices}
        if self.req.include_usage:
            body["usage"] = usage
        return b"data: " + json.dumps(body).encode() + b"\n\n"

    async def _stream(self, events, send) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream; charset=utf-8"),
                                (b"cache-control", b"no-cache"),
                                (b"x-accel-buffering", b"no")]})

        async def emit(data: bytes) -> None:
            await send({"type": "http.response.body", "body": data, "more_body": True})

        chat = self.req.kind == "chat"
        tb = self.state.engine.tokenizer.token_bytes
        offsets = [0] * len(self.jobs)
        if chat:
            await emit(b"".join(self._chunk([{"index": j.index, "delta": {"role": "assistant",
                                                                          "content": ""},
                                              "logprobs": None, "finish_reason": None}])
                                for j in self.jobs))
        async for kind, index, item in events:
            if kind == "piece":
                if not item.text and not item.logprobs:
                    continue
                lp = None
                if self.req.logprobs is not None and item.logprobs:
                    lp = (P.chat_logprobs(item.logprobs, tb) if chat else
                          P.completion_logprobs(item.logprobs, tb, offsets[index]))
                offsets[index] += len(item.text)
                if chat:
                    choice = {"index": index, "delta": {"content": item.text},
                              "logprobs": lp, "finish_reason": None}
                else:
                    choice = {"index": index, "text": item.text, "logprobs": lp,
                              "finish_reason": None}
                await emit(self._chunk([choice]))
            elif kind == "done":
                choice = ({"index": index, "delta": {}, "logprobs": None,
                           "finish_reason": item.finish_reason} if chat else
                          {"index": index, "text": "", "logprobs": None,
                           "finish_reason": item.finish_reason})
                await emit(self._chunk([choice]))
            else:
                status, typ, code = _status_of(item)
                err = P.APIError(status, str(item), type=typ, code=code)
                await emit(b"data: " + json.dumps(P.error_body(err)).encode() + b"\n\n")
                break
        else:
            if self.req.include_usage:
                body = {"id": self.id, "object": "chat.completion.chunk" if chat
                        else "text_completion", "created": self.created,
                        "model": self.req.model, "choices": [],
                        "usage": P.usage(sum(self.prompt_lens), sum(self.tokens))}
                await emit(b"data: " + json.dumps(body).encode() + b"\n\n")
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n",
                    "more_body": False})
