"""GGUF tokenizers as llama.cpp runs them: byte-level BPE (``gpt2``) and
SentencePiece-style BPE with byte fallback (``llama``: Llama 2, Mistral, Gemma).

``llama`` (llama.cpp's ``llm_tokenizer_spm``): spaces become ``▁`` (a ``▁``
prepended when ``tokenizer.ggml.add_space_prefix``), then adjacent pieces merge,
highest ``tokenizer.ggml.scores`` of the merged token first, and characters no
token holds become ``<0xXX>`` byte tokens. Here that is a ``tokenizers`` BPE
model whose merges are every (left, right) split of a normal token into two
tokens, ranked by the merged token's score (:func:`spm_merges`), with
``byte_fallback``.

The GGUF holds ``tokenizer.ggml.tokens`` (byte-level strings, GPT-2's
byte-to-unicode alphabet), ``tokenizer.ggml.merges`` (``"a b"`` by rank),
``tokenizer.ggml.token_type`` and a pre-tokenizer name. This module turns them
into a Hugging Face ``tokenizers.Tokenizer`` (saved as ``tokenizer.json``) and
wraps it in :class:`Tokenizer`.

Pre-tokenizers follow llama.cpp's ``llama-vocab.cpp``: regexes applied one after
the other, each splitting the pieces the previous one left. ``"smollm"`` (and
starcoder, refact, command-r, codeshell, exaone, minerva) is
``\\p{N}`` (each digit alone) then GPT-2's
``'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+``.

Special tokens: CONTROL tokens (type 3) are matched in text only with
``parse_special=True``; USER_DEFINED tokens (type 4) always are, as in
llama.cpp.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from .._errors import InvalidArgumentError, ModelLoadError

__all__ = ["Tokenizer", "load_tokenizer", "build_hf_tokenizer", "build_spm_tokenizer",
           "spm_merges", "bytes_to_unicode",
           "gguf_tokenizer_info", "normalize_chat_messages", "PRE_TOKENIZER_REGEXES",
           "EOG_TOKEN_TEXTS", "CHAT_ROLES"]

#: roles a chat message may have (the role is written into the prompt as is)
CHAT_ROLES = ("system", "user", "assistant", "tool")

#: private-use characters marking message contents in a rendered template
_OPEN, _CLOSE = "\ue000", "\ue001"


def _check_text(text: str, what: str) -> str:
    """``text`` if it is valid Unicode text (encodable as UTF-8).

    Raises:
        InvalidArgumentError: a lone surrogate (e.g. from bytes decoded with
            ``surrogateescape``), naming its position.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidArgumentError(
            f"{what} is not valid Unicode text: a lone surrogate at index {exc.start}",
            expected="text encodable as UTF-8",
            got=repr(text[max(exc.start - 10, 0):exc.end + 10])) from None
    return text


def normalize_chat_messages(messages: Any) -> list[dict[str, Any]]:
    """Chat messages as the templates expect them: ``{"role", "content"}``
    dicts with string contents (other keys kept).

    ``content`` may be a string, ``None`` (read as ``""``, as an assistant
    turn that only called tools) or OpenAI-style parts
    ``[{"type": "text", "text": ...}, ...]`` (their texts joined with
    ``"\\n"``).

    Raises:
        InvalidArgumentError: not a non-empty list of dicts, a missing
            ``role`` or ``content``, a role outside :data:`CHAT_ROLES`, a
            content of another type, a non-text part, or text with a lone
            surrogate.
    """
    if isinstance(messages, (str, bytes, bytearray)) or not isinstance(messages, Sequence):
        raise InvalidArgumentError("chat messages must be a list of dicts",
                                   expected="[{'role': ..., 'content': ...}]",
                                   got=type(messages).__name__)
    if not messages:
        raise InvalidArgumentError("no chat messages", expected="at least one message",
                                   got="[]")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise InvalidArgumentError(f"chat message {i} is not a dict",
                                       expected="{'role': ..., 'content': ...}",
                                       got=type(m).__name__)
        if "role" not in m or "content" not in m:
            raise InvalidArgumentError(f"chat message {i} needs 'role' and 'content'",
                                       expected="{'role': ..., 'content': ...}",
                                       got=f"keys {sorted(map(str, m))}")
        role = m["role"]
        if not isinstance(role, str) or role not in CHAT_ROLES:
            raise InvalidArgumentError(f"chat message {i} has an unknown role",
                                       expected=f"one of {', '.join(CHAT_ROLES)}",
                                       got=repr(role))
        content = m["content"]
        if content is None:
            content = ""
        elif isinstance(content, Sequence) and not isinstance(content, str):
            texts = []
            for j, part in enumerate(content):
                if (not isinstance(part, Mapping) or part.get("type") != "text"
                        or not isinstance(part.get("text"), str)):
                    raise InvalidArgumentError(
                        f"chat message {i}, content part {j}: only text parts are supported",
                        expected="{'type': 'text', 'text': str}", got=repr(part)[:80])
                texts.append(part["text"])
            content = "\n".join(texts)
        elif not isinstance(content, str):
            raise InvalidArgumentError(f"chat message {i} has a content of the wrong type",
                                       expected="str, None or a list of text parts",
                                       got=type(content).__name__)
        out.append({**m, "role": role,
                    "content": _check_text(content, f"chat message {i}'s content")})
    return out

GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"

LLAMA3_REGEX = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
                r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
               r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

#: llama.cpp pre-tokenizer name -> regexes applied in order (llama-vocab.cpp).
PRE_TOKENIZER_REGEXES: dict[str, tuple[str, ...]] = {
    **{name: (r"\p{N}", GPT2_REGEX) for name in
       ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva")},
    **{name: (GPT2_REGEX,) for name in ("gpt-2", "mpt", "olmo", "jais")},
    **{name: (LLAMA3_REGEX,) for name in ("llama3", "llama-v3", "llama-bpe", "falcon3",
                                          "pixtral")},
    **{name: (QWEN2_REGEX,) for name in ("qwen2", "deepseek-r1-qwen", "megrez")},
}

#: Texts of control tokens llama.cpp treats as end-of-generation besides the EOS id.
EOG_TOKEN_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                   "<EOT>", "<|end_of_text|>", "<｜end▁of▁sentence｜>")

_TOKEN_CONTROL = 3
_TOKEN_USER_DEFINED = 4


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table."""
    keep = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
            + list(range(ord("®"), ord("ÿ") + 1)))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def build_hf_tokenizer(tokens: Sequence[str], merges: Sequence[str], token_types: Sequence[int],
                       pre: str) -> Any:
    """Builds a ``tokenizers.Tokenizer`` equivalent to llama.cpp's BPE tokenizer.

    Args:
        tokens: ``tokenizer.ggml.tokens`` (index = token id).
        merges: ``tokenizer.ggml.merges`` (``"left right"``, by rank).
        token_types: ``tokenizer.ggml.token_type`` per token.
        pre: ``tokenizer.ggml.pre`` (e.g. ``"smollm"``).

    Returns:
        The ``tokenizers.Tokenizer``.

    Raises:
        ModelLoadError: unknown pre-tokenizer name or malformed merges.
    """
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    regexes = PRE_TOKENIZER_REGEXES.get(pre)
    if regexes is None:
        raise ModelLoadError(f"unsupported GGUF pre-tokenizer {pre!r} (supported: "
                             f"{', '.join(sorted(PRE_TOKENIZER_REGEXES))})")
    try:
        pairs = [tuple(m.split(" ", 1)) for m in merges]
    except ValueError as exc:  # pragma: no cover - split(maxsplit) cannot raise
        raise ModelLoadError(f"malformed BPE merges: {exc}") from exc
    if any(len(p) != 2 for p in pairs):
        raise ModelLoadError("malformed BPE merges: a merge without a space")
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False))
    if regexes[-1] == GPT2_REGEX:
        steps = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes[:-1]]
        # the last regex is GPT-2's, which ByteLevel applies itself before mapping bytes
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    else:
        steps = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes]
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    control = [AddedToken(t, special=True, normalized=False)
               for t, ty in zip(tokens, token_types) if ty == _TOKEN_CONTROL]
    user = [AddedToken(t, special=False, normalized=False)
            for t, ty in zip(tokens, token_types) if ty == _TOKEN_USER_DEFINED]
    tok.add_special_tokens(control)
    tok.add_tokens(user)
    return tok


def spm_merges(tokens: Sequence[str], scores: Sequence[float],
               token_types: Sequence[int]) -> list[tuple[str, str]]:
    """BPE merges equivalent to llama.cpp's SPM merging: for each normal token
    (type 1) every split into two tokens of the vocabulary, ordered by the
    merged token's score, highest first (ties: lower token id, then shorter
    left part)."""
    vocab = {t: i for i, t in enumerate(tokens) if token_types[i] in (1, 6)}
    ranked = []
    for i, t in enumerate(tokens):
        if token_types[i] != 1 or len(t) < 2:
            continue
        for cut in range(1, len(t)):
            left, right = t[:cut], t[cut:]
            if left in vocab and right in vocab:
                ranked.append((-float(scores[i]), i, cut, left, right))
    ranked.sort()
    return [(left, right) for _, _, _, left, right in ranked]


def build_spm_tokenizer(tokens: Sequence[str], scores: Sequence[float],
                        token_types: Sequence[int], add_space_prefix: bool,
                        unk_id: int | None = None) -> Any:
    """Builds a ``tokenizers.Tokenizer`` equivalent to llama.cpp's SPM tokenizer
    (GGUF ``tokenizer.ggml.model == "llama"``).

    Args:
        tokens / scores / token_types: the GGUF's ``tokenizer.ggml.*`` arrays.
        add_space_prefix: ``tokenizer.ggml.add_space_prefix`` (a ``▁`` before the text).
        unk_id: ``tokenizer.ggml.unknown_token_id``.

    Returns:
        The ``tokenizers.Tokenizer``.
    """
    from tokenizers import AddedToken, decoders, models, normalizers
    from tokenizers import Tokenizer as HFTokenizer

    vocab = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    unk = tokens[unk_id] if unk_id is not None and 0 <= unk_id < len(tokens) else None
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=spm_merges(tokens, scores, token_types),
                                 unk_token=unk, fuse_unk=True, byte_fallback=True))
    steps = [normalizers.Replace(" ", "▁")]
    if add_space_prefix:
        steps.insert(0, normalizers.Prepend("▁"))
    tok.normalizer = normalizers.Sequence(steps)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse()])
    control = [AddedToken(t, special=True, normalized=False)
               for t, ty in zip(tokens, token_types) if ty == _TOKEN_CONTROL]
    user = [AddedToken(t, special=False, normalized=False)
            for t, ty in zip(tokens, token_types) if ty == _TOKEN_USER_DEFINED]
    tok.add_special_tokens(control)
    tok.add_tokens(user)
    return tok


class Tokenizer:
    """Text <-> token ids for a GGUF-derived model.

    Args:
        hf_tokenizer: a ``tokenizers.Tokenizer`` (see :func:`build_hf_tokenizer`).
        eos_token_ids: ids that end generation (the GGUF's EOS first).
        bos_token_id: the BOS id, or ``None``.
        chat_template: a Jinja2 chat template, or ``None``.
        add_bos: whether :meth:`encode` prepends BOS (``tokenizer.ggml.add_bos_token``).

    Use :meth:`from_gguf` or :meth:`from_model_dir` rather than the constructor.
    """

    def __init__(self, hf_tokenizer: Any, *, eos_token_ids: Iterable[int],
                 bos_token_id: int | None = None, chat_template: str | None = None,
                 add_bos: bool = False, model: str = "gpt2"):
        from tokenizers import Tokenizer as HFTokenizer

        #: the GGUF tokenizer model: ``"gpt2"`` (byte-level) or ``"llama"`` (SPM)
        self.model = model
        self._tok = hf_tokenizer
        # a twin that reads control-token text as plain text (parse_special=False);
        # two objects rather than toggling one keeps encode() thread-safe
        self._tok_plain = HFTokenizer.from_str(hf_tokenizer.to_str())
        self._tok_plain.encode_special_tokens = True
        self.eos_token_ids: tuple[int, ...] = tuple(int(i) for i in eos_token_ids)
        self.bos_token_id = bos_token_id
        self.chat_template = chat_template
        self.add_bos = add_bos
        self._template: Any = None
        self._bytes = self._token_bytes_table()

    # -- construction -------------------------------------------------------
    @classmethod
    def from_gguf(cls, gguf: Any) -> Tokenizer:
        """Builds the tokenizer from a GGUF file (path or ``GGUFFile``).

        Raises:
            ModelLoadError: unreadable file, a tokenizer model other than
                ``"gpt2"`` (byte-level BPE), or an unknown pre-tokenizer.
        """
        from ._gguf import GGUFFile, open_gguf

        g = gguf if isinstance(gguf, GGUFFile) else open_gguf(gguf)
        info = gguf_tokenizer_info(g)
        if info["model"] == "llama":
            unk = g.get("tokenizer.ggml.unknown_token_id")
            hf = build_spm_tokenizer(g.require("tokenizer.ggml.tokens"),
                                     g.require("tokenizer.ggml.scores"), g.token_types(),
                                     info["add_space_prefix"], None if unk is None else int(unk))
        else:
            hf = build_hf_tokenizer(g.require("tokenizer.ggml.tokens"),
                                    g.require("tokenizer.ggml.merges"), g.token_types(),
                                    info["pre"])
        return cls(hf, eos_token_ids=info["eos_token_ids"], bos_token_id=info["bos_token_id"],
                   chat_template=info["chat_template"], add_bos=info["add_bos"],
                   model=info["model"])

    @classmethod
    def from_model_dir(cls, folder: str | Path) -> Tokenizer:
        """Loads ``tokenizer.json`` + ``genai_config.json`` from a prepared model folder.

        Raises:
            ModelLoadError: a file is missing or unreadable.
        """
        from tokenizers import Tokenizer as HFTokenizer

        folder = Path(folder)
        try:
            cfg = json.loads((folder / "genai_config.json").read_text("utf-8"))
            hf = HFTokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception as exc:  # OSError, JSON errors, tokenizers parse errors
            raise ModelLoadError(f"cannot load the tokenizer from {folder}: {exc}",
                                 model=str(folder)) from exc
        if "eos_token_ids" not in cfg and isinstance(cfg.get("model"), dict):
            return cls._from_ort_genai(hf, cfg["model"], folder)
        tk = cfg.get("tokenizer", {})
        return cls(hf, eos_token_ids=cfg["eos_token_ids"], bos_token_id=cfg.get("bos_token_id"),
                   chat_template=cfg.get("chat_template"), add_bos=tk.get("add_bos", False),
                   model=tk.get("model", "gpt2"))

    @classmethod
    def _from_ort_genai(cls, hf: Any, model: dict, folder: Path) -> Tokenizer:
        """An onnxruntime-genai folder: ids from its ``genai_config.json``
        (``model.eos_token_id``, ``bos_token_id``), BOS and chat template from
        ``tokenizer_config.json`` when present."""
        eos = model.get("eos_token_id", [])
        eos = [eos] if isinstance(eos, int) else list(eos)
        try:
            tc = json.loads((folder / "tokenizer_config.json").read_text("utf-8"))
        except (OSError, ValueError):
            tc = {}
        dec = json.loads(hf.to_str()).get("decoder") or {}
        kinds = {dec.get("type")} | {d.get("type") for d in dec.get("decoders", []) or []}
        return cls(hf, eos_token_ids=eos, bos_token_id=model.get("bos_token_id"),
                   chat_template=tc.get("chat_template"),
                   add_bos=bool(tc.get("add_bos_token", False)),
                   model="gpt2" if "ByteLevel" in kinds else "llama")

    def save(self, path: str | Path) -> None:
        """Writes the ``tokenizers`` JSON (``tokenizer.json``)."""
        self._tok.save(str(path))

    @property
    def hf_tokenizer(self) -> Any:
        """The underlying ``tokenizers.Tokenizer``."""
        return self._tok

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    # -- encode / decode ----------------------------------------------------
    def encode(self, text: str, parse_special: bool = False) -> list[int]:
        """Token ids of ``text`` (BOS prepended only if the GGUF asks for it).

        Args:
            text: the text.
            parse_special: match control-token text such as ``<|im_start|>`` as
                the special token; when ``False`` it is tokenized as plain text.

        Raises:
            InvalidArgumentError: ``text`` is not a str (bytes: decode them
                first), holds a lone surrogate, or ``parse_special`` is not a bool.
        """
        if not isinstance(text, str):
            raise InvalidArgumentError("text to encode must be a str (decode bytes first)",
                                       expected="str", got=type(text).__name__)
        if not isinstance(parse_special, bool):
            raise InvalidArgumentError("parse_special must be a bool", expected="True or False",
                                       got=repr(parse_special))
        _check_text(text, "the text")
        tok = self._tok if parse_special else self._tok_plain
        ids = tok.encode(text, add_special_tokens=False).ids
        if self.add_bos and self.bos_token_id is not None:
            ids = [self.bos_token_id, *ids]
        return ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids``; invalid UTF-8 becomes U+FFFD.

        Args:
            ids: token ids.
            skip_special_tokens: drop control tokens instead of writing their text.
        """
        data = b"".join(self._bytes[i] for i in ids
                        if not (skip_special_tokens and self._is_control[i]))
        return data.decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes of one token (may be part of a UTF-8 sequence).

        Raises:
            IndexError: ``token_id`` is outside the vocabulary.
        """
        if not 0 <= token_id < len(self._bytes):
            raise IndexError(f"token id {token_id} outside the vocabulary "
                             f"(0..{len(self._bytes) - 1})")
        return self._bytes[token_id]

    def is_special(self, token_id: int) -> bool:
        """Whether ``token_id`` is a control token (``<|im_end|>``...)."""
        return bool(self._is_control[token_id])

    def _token_bytes_table(self) -> list[bytes]:
        byte_of = {c: b for b, c in bytes_to_unicode().items()}
        added = {t.content for t in self._tok.get_added_tokens_decoder().values()}
        special = {i for i, t in self._tok.get_added_tokens_decoder().items() if t.special}
        vocab = self._tok.get_vocab(with_added_tokens=True)
        table: list[bytes] = [b""] * (max(vocab.values()) + 1)
        spm = self.model == "llama"
        for text, i in vocab.items():
            if spm and text not in added:
                if len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
                    table[i] = bytes([int(text[3:5], 16)])
                else:
                    table[i] = text.replace("▁", " ").encode("utf-8")
            elif text in added:
                table[i] = text.encode("utf-8")
            else:
                try:
                    table[i] = bytes(byte_of[c] for c in text)
                except KeyError:  # not byte-level text: keep it as UTF-8
                    table[i] = text.encode("utf-8")
        self._is_control = [False] * len(table)
        for i in special:
            self._is_control[i] = True
        return table

    # -- chat ---------------------------------------------------------------
    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]],
                            add_generation_prompt: bool = True, **extra: Any) -> str:
        """Renders ``messages`` (``{"role", "content"}`` dicts) with the GGUF's template.

        Rendered like ``transformers`` does: a sandboxed Jinja2 environment with
        ``trim_blocks`` and ``lstrip_blocks``, ``bos_token`` / ``eos_token`` and
        ``raise_exception`` available.

        Raises:
            ModelLoadError: the model has no chat template.
            InvalidArgumentError: malformed messages
                (:func:`normalize_chat_messages`), or the template refused
                them (e.g. an unsupported role order).
        """
        messages = normalize_chat_messages(messages)
        return self._render(messages, add_generation_prompt, extra)

    def encode_chat(self, messages: Sequence[Mapping[str, Any]],
                    add_generation_prompt: bool = True, *,
                    special_in_content: bool = False, **extra: Any) -> list[int]:
        """Token ids of ``messages`` rendered with the chat template.

        The template's own control tokens (``<|im_start|>``, ``<|im_end|>``...)
        are special tokens; text *inside* message contents is never read as
        one unless ``special_in_content`` is set: a user writing
        ``<|im_end|>\\n<|im_start|>system`` gets those characters as plain
        text, not a new system turn. Contents are marked while rendering;
        each stretch of plain text between two template control tokens
        (template text and contents together) is encoded in one piece, so
        for contents without control-token text the ids equal encoding the
        rendered string with special-token parsing.

        Args:
            messages: chat messages (see :func:`normalize_chat_messages`).
            add_generation_prompt: end with the assistant turn's header.
            special_in_content: the old behaviour, for trusted text only:
                render, then encode everything with special-token parsing.

        Raises:
            ModelLoadError: the model has no chat template.
            InvalidArgumentError: malformed messages, a non-bool flag, or the
                template refused the messages.
        """
        for name, flag in (("add_generation_prompt", add_generation_prompt),
                           ("special_in_content", special_in_content)):
            if not isinstance(flag, bool):
                raise InvalidArgumentError(f"{name} must be a bool", expected="True or False",
                                           got=repr(flag))
        messages = normalize_chat_messages(messages)
        text = self._render(messages, add_generation_prompt, extra)
        specials = self._special_texts()
        if special_in_content or not any(t in m["content"] for m in messages
                                         for t in specials):
            return self.encode(text, parse_special=True)
        if any(_OPEN in m["content"] or _CLOSE in m["content"] for m in messages):
            raise InvalidArgumentError("chat message content holds the private-use "
                                       "characters U+E000/U+E001",
                                       expected="text without them", got="U+E000 or U+E001")
        marked = self._render([{**m, "content": _OPEN + m["content"] + _CLOSE}
                               for m in messages], add_generation_prompt, extra)
        return self._encode_segments(marked)

    def _special_texts(self) -> list[str]:
        """Texts of the control tokens, longest first."""
        if getattr(self, "_specials", None) is None:
            self._specials = sorted((t.content for t in
                                     self._tok.get_added_tokens_decoder().values()
                                     if t.special), key=len, reverse=True)
        return self._specials

    def _encode_segments(self, marked: str) -> list[int]:
        """Ids of a rendered template whose contents sit between ``_OPEN`` and
        ``_CLOSE``: control-token text outside them becomes the control token,
        everything else (template text and contents) plain text, encoded in
        one piece between two control tokens."""
        import re

        vocab = self._tok.get_vocab(with_added_tokens=True)
        split = re.compile("(" + "|".join(map(re.escape, self._special_texts())) + ")")
        ids: list[int] = []
        plain: list[str] = []

        def flush() -> None:
            if plain:
                ids.extend(self._tok_plain.encode("".join(plain), add_special_tokens=False).ids)
                plain.clear()

        inside = False
        for piece in re.split(f"([{_OPEN}{_CLOSE}])", marked):
            if piece in (_OPEN, _CLOSE):
                inside = piece == _OPEN
            elif inside:
                plain.append(piece)
            else:
                for j, part in enumerate(split.split(piece)):
                    if j % 2:
                        flush()
                        ids.append(vocab[part])
                    elif part:
                        plain.append(part)
        flush()
        if self.add_bos and self.bos_token_id is not None:
            ids = [self.bos_token_id, *ids]
        return ids

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool,
                extra: dict[str, Any]) -> str:
        if not self.chat_template:
            raise ModelLoadError("this model has no chat template")
        if self._template is None:
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            def raise_exception(message: str) -> None:
                raise ValueError(message)

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = raise_exception
            env.filters["tojson"] = lambda v, indent=None: json.dumps(v, ensure_ascii=False,
                                                                        indent=indent)
            self._template = env.from_string(self.chat_template)
        eos = self.eos_token_ids[0] if self.eos_token_ids else None
        from jinja2 import TemplateError

        try:
            return self._template.render(
                messages=list(messages), add_generation_prompt=add_generation_prompt,
                bos_token=(self.decode([self.bos_token_id])
                           if self.bos_token_id is not None else ""),
                eos_token=self.decode([eos]) if eos is not None else "", **extra)
        except (TemplateError, ValueError, TypeError, KeyError) as exc:
            raise InvalidArgumentError(f"the chat template refused the messages: "
                                       f"{type(exc).__name__}: {exc}") from exc


def gguf_tokenizer_info(g: Any) -> dict[str, Any]:
    """Tokenizer settings of a GGUF: ``model`` (``"gpt2"`` / ``"llama"``),
    ``add_space_prefix``, ``pre``, ``eos_token_ids``, ``bos_token_id``,
    ``add_bos``, ``chat_template``.

    ``eos_token_ids`` is the GGUF's EOS id followed by the other control tokens
    llama.cpp also treats as end-of-generation (:data:`EOG_TOKEN_TEXTS`).

    Raises:
        ModelLoadError: the tokenizer model is not ``"gpt2"`` (byte-level BPE).
    """
    model = g.require("tokenizer.ggml.model")
    if model not in ("gpt2", "llama"):
        raise ModelLoadError(f"unsupported GGUF tokenizer model {model!r} (supported: 'gpt2', "
                             f"byte-level BPE, and 'llama', SentencePiece-style BPE)",
                             model=str(g.path))
    if model == "llama" and not g.has("tokenizer.ggml.scores"):
        raise ModelLoadError("GGUF tokenizer model 'llama' without tokenizer.ggml.scores",
                             model=str(g.path))
    tokens = g.require("tokenizer.ggml.tokens")
    types = g.token_types()
    eos = g.get("tokenizer.ggml.eos_token_id")
    eos_ids = [] if eos is None else [int(eos)]
    eot = g.get("tokenizer.ggml.eot_token_id")
    if eot is not None and int(eot) not in eos_ids:
        eos_ids.append(int(eot))
    for i, text in enumerate(tokens):
        if types[i] == _TOKEN_CONTROL and text in EOG_TOKEN_TEXTS and i not in eos_ids:
            eos_ids.append(i)
    bos = g.get("tokenizer.ggml.bos_token_id")
    return {
        "model": model,
        "add_space_prefix": bool(g.get("tokenizer.ggml.add_space_prefix", True)),
        "pre": g.get("tokenizer.ggml.pre", "gpt-2"),
        "eos_token_ids": eos_ids,
        "bos_token_id": None if bos is None else int(bos),
        "add_bos": bool(g.get("tokenizer.ggml.add_bos_token", False)),
        "chat_template": g.get("tokenizer.chat_template"),
    }


def load_tokenizer(folder: str | Path) -> Tokenizer:
    """The tokenizer of a prepared model folder (see :meth:`Tokenizer.from_model_dir`).

    Raises:
        ModelLoadError: ``tokenizer.json`` or ``genai_config.json`` missing or unreadable.
    """
    return Tokenizer.from_model_dir(folder)
