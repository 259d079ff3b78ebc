"""What the engine (:mod:`actorrt.genai.engine`) checks before and while it
admits a request: the prompt's token ids (typed refusals of malformed
prompts) and the KV-cache bytes a set of requests holds at once.

KV arithmetic (see ``docs/architecture.md``, "Admission and KV accounting"):
on the block-paged cache (:mod:`.kv_cache`, the default) each request holds
its own blocks and nothing is copied (:func:`kv_need_paged`). On the
contiguous layout, decoding requests share one right-padded buffer, a row each, every row as
long as the longest request's capacity (prompt + ``max_new_tokens``, at most
the context window). When the batch changes, the new buffer is filled from
the old one and the newcomers' own prefill caches, which together are at
most as big again: a set of requests holds at most twice its padded batch.
A request alone holds its own cache (which becomes the batch without a
copy) plus at most a copy of its prompt's rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .._errors import InvalidArgumentError, OutOfMemoryError

__all__ = ["encode_prompt", "kv_need", "kv_need_paged", "kv_room", "kv_room_alone", "kv_error"]


def encode_prompt(tokenizer: Any, prompt: Any, *, vocab_size: int,
                  special_in_content: bool = False) -> list[int]:
    """Token ids of a prompt.

    Args:
        tokenizer: the model's :class:`~actorrt.genai.tokenizer.Tokenizer`.
        prompt: a string (tokenized as is: control-token text such as
            ``<|im_end|>`` stays plain text), token ids (a list, or a 1-D
            integer array), or chat messages rendered with the chat template
            (:meth:`~actorrt.genai.tokenizer.Tokenizer.encode_chat`: the
            template's control tokens are special, text inside contents is
            not, unless ``special_in_content``).
        vocab_size: ids must lie in ``[0, vocab_size)``.
        special_in_content: read control-token text inside chat contents as
            control tokens (trusted text only).

    Raises:
        InvalidArgumentError: bytes (decode them first), text with a lone
            surrogate, malformed chat messages, out-of-vocab, boolean or
            non-integer ids, a prompt of another type, a non-bool flag.
    """
    if not isinstance(special_in_content, bool):
        raise InvalidArgumentError("special_in_content must be a bool",
                                   expected="True or False", got=repr(special_in_content))
    if isinstance(prompt, (bytes, bytearray, memoryview)):
        raise InvalidArgumentError("a bytes prompt is ambiguous: decode it to str first "
                                   "(or pass a list of token ids)",
                                   expected="str | list[int] | list[dict]",
                                   got=type(prompt).__name__)
    if isinstance(prompt, str):
        return list(tokenizer.encode(prompt))
    if isinstance(prompt, np.ndarray):
        if prompt.ndim != 1 or prompt.dtype.kind not in "iu":
            raise InvalidArgumentError("a token-id array must be 1-D integers",
                                       expected="1-D int array",
                                       got=f"{prompt.ndim}-D {prompt.dtype}")
        prompt = prompt.tolist()
    if isinstance(prompt, Sequence) and prompt and any(isinstance(m, dict) for m in prompt):
        return list(tokenizer.encode_chat(list(prompt), add_generation_prompt=True,
                                          special_in_content=special_in_content))
    if isinstance(prompt, Sequence) and all(
            isinstance(t, (int, np.integer)) and not isinstance(t, (bool, np.bool_))
            for t in prompt):
        ids = [int(t) for t in prompt]
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise InvalidArgumentError("prompt token ids out of the vocabulary",
                                       expected=f"ids in [0, {vocab_size})", got=str(bad[:5]))
        return ids
    raise InvalidArgumentError("prompt must be a string, a list of token ids or a list of "
                               "chat messages", expected="str | list[int] | list[dict]",
                               got=type(prompt).__name__)


def kv_need(requests: Sequence[tuple[int, int]], bytes_per_token: int) -> int:
    """Most KV-cache bytes the engine holds at once serving ``requests``
    together (see the module docstring).

    Args:
        requests: ``(capacity, prompt tokens)`` of each request (tokens).
        bytes_per_token: KV bytes of one token (every layer's key and value).
    """
    if not requests:
        return 0
    if len(requests) == 1:
        capacity, prompt = requests[0]
        return (capacity + prompt) * bytes_per_token
    return 2 * len(requests) * max(c for c, _ in requests) * bytes_per_token


def kv_room(budget: int | None, memory: Any) -> int | None:
    """KV bytes an engine may hold now: the smaller of ``budget`` and what
    the provider's memory limit leaves beside everything else it holds
    (weights, workspace...); ``None``: unlimited.

    Args:
        budget: ``kv_budget_bytes`` or ``None``.
        memory: the host provider's memory accountant (``limit``,
            ``statistics()``).
    """
    room = budget
    if memory.limit is not None:
        st = memory.statistics()
        left = memory.limit - (st.live_bytes - st.live_by_role.get("kv-cache", 0))
        room = left if room is None else min(room, left)
    return room


def kv_room_alone(memory: Any) -> int | None:
    """KV bytes the memory limit leaves beside the weights alone (what a
    request could ever get); ``None``: no limit."""
    if memory.limit is None:
        return None
    return memory.limit - memory.statistics().live_by_role.get("weights", 0)


def kv_error(prompt_tokens: int, new_tokens: int, need: int, bytes_per_token: int, room: int,
             memory: Any, model: str | None) -> OutOfMemoryError:
    """The OutOfMemoryError of a request whose KV cache never fits the
    memory limit, naming the model, the bytes asked for and the way out."""
    return OutOfMemoryError(
        f"a request of {prompt_tokens} prompt tokens + {new_tokens} new tokens needs {need} "
        f"bytes of KV cache ({bytes_per_token} bytes a token); the session's memory limit "
        f"leaves {max(room, 0)} bytes for it beside the weights: lower max_new_tokens, "
        f"shorten the prompt or raise memory_limit",
        requested=need, in_use=memory.statistics().live_bytes, limit=memory.limit,
        role="kv-cache", provider=memory.provider, model=model)


def kv_need_paged(capacities: Sequence[int], block_size: int, block_bytes: int) -> int:
    """Most KV-cache bytes a block-paged cache (:mod:`actorrt.genai.kv_cache`)
    holds serving requests of these capacities (tokens) together: each its
    own blocks, nothing copied when the batch changes."""
    return sum(-(-int(c) // block_size) for c in capacities) * block_bytes
