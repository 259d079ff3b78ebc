"""The OpenAI wire format: request bodies checked into typed requests, and the
JSON of responses, stream chunks and errors.

Nothing here touches the network or the engine: :func:`parse_completion` and
:func:`parse_chat` turn a decoded JSON body into a :class:`ParsedRequest` (or
raise :class:`APIError`), and the ``*_body`` / ``*_chunk`` helpers build the
response objects of https://platform.openai.com/docs/api-reference.
"""

from __future__ import annotations

import math
import secrets
import time
from typing import Any, Sequence

import attrs

from .._errors import ActorRTError, GenerationError
from ..genai.sampling import MAX_TOP_LOGPROBS, SamplingParams, TokenLogprob

__all__ = ["APIError", "ParsedRequest", "parse_completion", "parse_chat", "error_body",
           "DEFAULT_COMPLETION_TOKENS", "DEFAULT_CHAT_TOKENS", "MAX_N", "MAX_STOP"]

#: ``max_tokens`` of ``/v1/completions`` when the request gives none (OpenAI's)
DEFAULT_COMPLETION_TOKENS = 16
#: ``max_tokens`` of ``/v1/chat/completions`` when the request gives none
#: (bounded by the context; a bound keeps each request's KV reservation small)
DEFAULT_CHAT_TOKENS = 512
#: most choices a request may ask for (``n``)
MAX_N = 16
#: most stop strings (OpenAI: 4)
MAX_STOP = 4
#: most alternatives of ``/v1/completions``' ``logprobs`` (OpenAI: 5)
MAX_COMPLETION_LOGPROBS = 5


class APIError(ActorRTError):
    """A request the server answers with an error status and an OpenAI-style
    body ``{"error": {"message", "type", "param", "code"}}``.

    Attributes:
        status: HTTP status (400, 401, 404, 413, 429, 500, 503).
        type: OpenAI error type, e.g. ``"invalid_request_error"``.
        param: the request field at fault, or ``None``.
        code: a machine-readable code (``"context_length_exceeded"``,
            ``"model_not_found"``, ``"invalid_api_key"``...) or ``None``.
        headers: extra response headers (``Retry-After`` on 429).
    """

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        self.status = status
        self.type = type
        self.param = param
        self.code = code
        self.headers = dict(headers or {})
        super().__init__(message)


def error_body(err: APIError) -> dict:
    return {"error": {"message": err.message, "type": err.type, "param": err.param,
                      "code": err.code}}


def _bad(message: str, param: str | None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


@attrs.frozen
class ParsedRequest:
    """A checked completion or chat request.

    Attributes:
        kind: ``"completion"`` or ``"chat"``.
        model: the model id asked for.
        prompts: one entry per prompt: a string, token ids, or chat messages
            (``/v1/completions`` may carry several prompts; chat one).
        sampling: :class:`SamplingParams` fields shared by every choice, all
            but ``max_new_tokens`` and ``logprobs`` (see :meth:`params`: the
            server fills ``max_new_tokens`` in once the prompt length is known).
        max_tokens: the request's ``max_tokens`` / ``max_completion_tokens``
            or ``None``.
        n: choices per prompt.
        stream: SSE or one JSON body. include_usage: ``stream_options``.
        logprobs: alternatives per token (``None``: no logprobs).
    """

    kind: str
    model: str
    prompts: list
    sampling: dict
    max_tokens: int | None
    n: int
    stream: bool
    include_usage: bool
    logprobs: int | None

    def params(self, max_new_tokens: int) -> SamplingParams:
        """The sampling parameters with ``max_new_tokens`` filled in.

        Raises:
            APIError: a combination :class:`SamplingParams` refuses (400).
        """
        try:
            return SamplingParams(max_new_tokens=max_new_tokens, logprobs=self.logprobs,
                                  **self.sampling)
        except GenerationError as exc:
            raise _bad(str(exc), None) from exc


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _get(body: dict, name: str, check, what: str, default=None, lo=None, hi=None,
         lo_open: bool = False):
    v = body.get(name)
    if v is None:
        return default
    if not check(v):
        raise _bad(f"'{name}' must be {what}, got {type(v).__name__} {v!r}"[:300], name)
    if lo is not None and (v <= lo if lo_open else v < lo):
        raise _bad(f"'{name}' must be {'>' if lo_open else '>='} {lo}, got {v!r}", name)
    if hi is not None and v > hi:
        raise _bad(f"'{name}' must be <= {hi}, got {v!r}", name)
    return v


def _common(body: Any, kind: str) -> dict:
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object", None)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("'model' is required and must be a string", "model")
    for name in ("suffix", "tools", "functions", "logit_bias"):
        if body.get(name):
            raise _bad(f"'{name}' is not supported by this server", name)
    if body.get("echo") not in (None, False):
        raise _bad("'echo' is not supported by this server", "echo")
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise _bad("only response_format {'type': 'text'} is supported", "response_format")
    stream = _get(body, "stream", lambda v: isinstance(v, bool), "a boolean", False)
    opts = body.get("stream_options")
    include_usage = False
    if opts is not None:
        if not isinstance(opts, dict):
            raise _bad("'stream_options' must be an object", "stream_options")
        if not stream:
            raise _bad("'stream_options' is only allowed with 'stream': true", "stream_options")
        include_usage = _get(opts, "include_usage", lambda v: isinstance(v, bool),
                             "a boolean", False)
    max_tokens = _get(body, "max_tokens", _is_int, "an integer", None, lo=1)
    mct = _get(body, "max_completion_tokens", _is_int, "an integer", None, lo=1)
    if mct is not None:
        if max_tokens is not None and max_tokens != mct:
            raise _bad("'max_tokens' and 'max_completion_tokens' disagree",
                       "max_completion_tokens")
        max_tokens = mct
    n = _get(body, "n", _is_int, "an integer", 1, lo=1, hi=MAX_N)
    best_of = _get(body, "best_of", _is_int, "an integer", None, lo=1)
    if best_of is not None and best_of != n:
        raise _bad("'best_of' other than 'n' is not supported", "best_of")
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    elif not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise _bad("'stop' must be a string or a list of strings", "stop")
    if len(stop) > MAX_STOP:
        raise _bad(f"'stop' may hold at most {MAX_STOP} strings", "stop")
    if any(not s for s in stop):
        raise _bad("'stop' strings must not be empty", "stop")
    sampling = {
        "temperature": float(_get(body, "temperature", _is_num, "a number", 1.0, lo=0, hi=2)),
        "top_p": float(_get(body, "top_p", _is_num, "a number", 1.0, lo=0, hi=1, lo_open=True)),
        "presence_penalty": float(_get(body, "presence_penalty", _is_num, "a number", 0.0,
                                       lo=-2, hi=2)),
        "frequency_penalty": float(_get(body, "frequency_penalty", _is_num, "a number", 0.0,
                                        lo=-2, hi=2)),
        # extensions llama.cpp's and vLLM's servers accept too
        "top_k": _get(body, "top_k", _is_int, "an integer", 0, lo=0),
        "min_p": float(_get(body, "min_p", _is_num, "a number", 0.0, lo=0, hi=0.999999)),
        "repetition_penalty": float(_get(body, "repetition_penalty", _is_num, "a number", 1.0,
                                         lo=0, lo_open=True)),
        "seed": _get(body, "seed", _is_int, "an integer", None, lo=0, hi=2**63 - 1),
        "stop": tuple(stop),
        "ignore_eos": _get(body, "ignore_eos", lambda v: isinstance(v, bool), "a boolean",
                           False),
    }
    return {"model": model, "stream": stream, "include_usage": include_usage,
            "max_tokens": max_tokens, "n": n, "sampling": sampling}


def parse_completion(body: Any) -> ParsedRequest:
    """``POST /v1/completions``: ``prompt`` a string, a list of strings, token
    ids, or a list of token-id lists; ``logprobs`` an integer in [0, 5].

    Raises:
        APIError: 400 naming the field at fault.
    """
    c = _common(body, "completion")
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        prompts: list = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        prompts = list(prompt)
    elif isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        prompts = [list(prompt)]
    elif (isinstance(prompt, list) and prompt and all(
            isinstance(p, list) and p and all(_is_int(t) for t in p) for p in prompt)):
        prompts = [list(p) for p in prompt]
    else:
        raise _bad("'prompt' must be a string, a list of strings, a list of token ids or a "
                   "list of token-id lists (not empty)", "prompt")
    if any(isinstance(p, str) and not p for p in prompts):
        raise _bad("'prompt' must not be empty", "prompt")
    logprobs = _get(body, "logprobs", _is_int, "an integer", None, lo=0,
                    hi=MAX_COMPLETION_LOGPROBS)
    return ParsedRequest("completion", c["model"], prompts, c["sampling"], c["max_tokens"],
                         c["n"], c["stream"], c["include_usage"], logprobs)


_ROLES = ("system", "developer", "user", "assistant", "tool")


def _message(m: Any, i: int) -> dict:
    param = f"messages[{i}]"
    if not isinstance(m, dict):
        raise _bad(f"{param} must be an object", param)
    role = m.get("role")
    if role not in _ROLES:
        raise _bad(f"{param}.role must be one of {', '.join(_ROLES)}, got {role!r}",
                   f"{param}.role")
    content = m.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not (isinstance(part, dict) and part.get("type") == "text"
                    and isinstance(part.get("text"), str)):
                raise _bad(f"{param}.content[{j}] must be a text part "
                           f"{{'type': 'text', 'text': ...}} (only text is supported)",
                           f"{param}.content")
            parts.append(part["text"])
        text = "".join(parts)
    else:
        raise _bad(f"{param}.content must be a string, a list of text parts or null",
                   f"{param}.content")
    return {"role": "system" if role == "developer" else role, "content": text}


def parse_chat(body: Any) -> ParsedRequest:
    """``POST /v1/chat/completions``: ``messages`` (roles system / developer /
    user / assistant / tool; content a string, text parts or null),
    ``logprobs`` a boolean and ``top_logprobs`` an integer in [0, 20].

    Raises:
        APIError: 400 naming the field at fault.
    """
    c = _common(body, "chat")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("'messages' must be a non-empty list", "messages")
    msgs = [_message(m, i) for i, m in enumerate(messages)]
    want = _get(body, "logprobs", lambda v: isinstance(v, bool), "a boolean", False)
    top = _get(body, "top_logprobs", _is_int, "an integer", None, lo=0, hi=MAX_TOP_LOGPROBS)
    if top is not None and not want:
        raise _bad("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    return ParsedRequest("chat", c["model"], [msgs], c["sampling"], c["max_tokens"], c["n"],
                         c["stream"], c["include_usage"], (top or 0) if want else None)


# ------------------------------------------------------------- responses
def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + secrets.token_hex(12)


def now() -> int:
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def chat_logprobs(entries: Sequence[TokenLogprob], token_bytes) -> dict:
    """Chat ``logprobs``: ``{"content": [{"token", "logprob", "bytes",
    "top_logprobs": [...]}], "refusal": None}``."""
    def one(tid: int, lp: float) -> dict:
        b = token_bytes(tid)
        return {"token": b.decode("utf-8", errors="replace"), "logprob": lp, "bytes": list(b)}

    return {"content": [{**one(e.token_id, e.logprob),
                         "top_logprobs": [one(t, v) for t, v in e.top]} for e in entries],
            "refusal": None}


def completion_logprobs(entries: Sequence[TokenLogprob], token_bytes, offset: int = 0) -> dict:
    """Completions ``logprobs``: ``tokens``, ``token_logprobs``,
    ``top_logprobs`` (one ``{token: logprob}`` a token) and ``text_offset``
    (each token's start in the choice's text, counted from ``offset``)."""
    tokens, offsets = [], []
    for e in entries:
        offsets.append(offset)
        s = token_bytes(e.token_id).decode("utf-8", errors="replace")
        tokens.append(s)
        offset += len(s)
    return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{token_bytes(t).decode("utf-8", errors="replace"): v
                              for t, v in e.top} for e in entries],
            "text_offset": offsets}
