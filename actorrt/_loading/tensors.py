"""Every tensor a model carries, checked before anything reads it.

:func:`check_tensor_protos` walks an ``onnx.ModelProto`` (main graph, every
subgraph, every model-local function with its attribute defaults and
subgraphs, training graphs) and checks each tensor it finds:

* inline data: ``raw_data`` holds exactly the bytes the element type and
  shape need, a typed field (``float_data``, ``int32_data``, ...) exactly
  the values; shapes have no negative dimension; the element type is known;
* external data: only for a model loaded from a path; the location is a
  relative path without NUL bytes that resolves (every symlink followed)
  inside the model's folder to a regular file with one link; ``offset`` and
  ``length`` are non-negative integers; ``length`` matches the tensor's
  bytes and ``offset + bytes`` fits in the file.

:func:`anchor_external_tensors` does the same for the ``onnx_ir`` model that
deserialization made: it points every ``ir.ExternalTensor`` (initializers
and attribute tensors, in functions too) at the model's folder, so none is
resolved against the process's working directory, and checks each again.

Raises :class:`~actorrt.ModelLoadError` naming the tensor and where it sits.
"""

from __future__ import annotations

import math
import os
import re
import stat
from pathlib import Path, PureWindowsPath
from typing import Iterator

import onnx
import onnx_ir as ir

from .._errors import ModelLoadError

__all__ = ["check_tensor_protos", "anchor_external_tensors", "iter_tensor_protos"]

_T = onnx.TensorProto
_EXTERNAL_KEYS = ("location", "offset", "length", "checksum")
_COMPLEX = (_T.COMPLEX64, _T.COMPLEX128)


def _bits_table() -> dict[int, int]:
    out = {}
    for dt in ir.DataType:
        if dt in (ir.DataType.UNDEFINED, ir.DataType.STRING):
            continue
        try:
            out[int(dt)] = dt.bitwidth
        except Exception:  # pragma: no cover - a type without a width
            pass
    return out


#: bits per element of each element type (``TensorProto.DataType``), no STRING
_BITS = _bits_table()


def _type_name(data_type: int) -> str:
    try:
        return _T.DataType.Name(data_type)
    except ValueError:
        return str(data_type)


# ---------------------------------------------------------------- walking


def _tensor_label(t: onnx.TensorProto, where: str, item: int | None = None) -> str:
    what = f"tensor {t.name!r}" if t.name else "the tensor"
    if item is not None:
        what += f" (item {item})"
    return f"{what} in {where}" if t.name or item is not None else f"{what} of {where}"


def _attr_tensors(a: onnx.AttributeProto, where: str) -> Iterator[tuple[str, onnx.TensorProto]]:
    # every field, whatever ``a.type`` claims: a mislabelled attribute must not
    # hide a tensor from the check
    if a.HasField("t"):
        yield _tensor_label(a.t, where), a.t
    for i, t in enumerate(a.tensors):
        yield _tensor_label(t, where, i), t
    if a.HasField("sparse_tensor"):
        yield from _sparse_tensors(a.sparse_tensor, "sparse tensor", f" of {where}")
    for i, s in enumerate(a.sparse_tensors):
        yield from _sparse_tensors(s, f"sparse tensor (item {i})", f" of {where}")
    if a.HasField("g"):
        yield from _graph_tensors(a.g, f" in graph {a.g.name!r} of {where}")
    for i, g in enumerate(a.graphs):
        yield from _graph_tensors(g, f" in graph {g.name!r} (item {i}) of {where}")


def _sparse_tensors(s: onnx.SparseTensorProto, kind: str, where: str):
    name = f" {s.values.name!r}" if s.values.name else ""
    for part, t in (("values", s.values), ("indices", s.indices)):
        yield f"{kind}{name} ({part}){where}", t


def _node_tensors(nodes, scope: str):
    for node in nodes:
        who = f"node {node.name!r}" if node.name else f"a {node.op_type} node"
        for a in node.attribute:
            yield from _attr_tensors(a, f"attribute {a.name!r} of {who}{scope}")


def _graph_tensors(g: onnx.GraphProto, scope: str):
    for t in g.initializer:
        yield f"initializer {t.name!r}{scope}", t
    for s in g.sparse_initializer:
        yield from _sparse_tensors(s, "sparse initializer", scope)
    yield from _node_tensors(g.node, scope)


def iter_tensor_protos(proto: onnx.ModelProto) -> Iterator[tuple[str, onnx.TensorProto]]:
    """``(label, tensor)`` for every ``TensorProto`` in ``proto``: initializers,
    sparse initializers (values and indices), every tensor-valued attribute
    field of every node (``Constant`` values included), in the main graph,
    all subgraphs, all model-local functions (nodes, attribute defaults and
    their subgraphs) and training graphs. ``label`` names the tensor and
    where it sits, for messages."""
    yield from _graph_tensors(proto.graph, "")
    for f in proto.functions:
        scope = f" in function '{f.domain}:{f.name}'"
        yield from _node_tensors(f.node, scope)
        for a in f.attribute_proto:
            yield from _attr_tensors(a, f"the default of attribute {a.name!r}{scope}")
    for i, ti in enumerate(proto.training_info):
        for part in ("initialization", "algorithm"):
            if ti.HasField(part):
                yield from _graph_tensors(getattr(ti, part), f" in training_info[{i}].{part}")


# ---------------------------------------------------------------- checking


def _nbytes(data_type: int, n: int) -> int:
    return (n * _BITS[data_type] + 7) // 8


def _typed_count(data_type: int, n: int) -> int:
    """Values a typed field holds for ``n`` elements (onnx.proto's packing)."""
    if data_type in _COMPLEX:
        return 2 * n
    bits = _BITS[data_type]
    if bits == 4:
        return (n + 1) // 2
    if bits == 2:
        return (n + 3) // 4
    return n


def _number(info: dict, key: str, fail) -> int | None:
    v = info.get(key)
    if v is None or v == "":
        return None
    if not re.fullmatch(r"[0-9]+", v):
        fail(f"external data {key} {v!r} is not a non-negative integer")
    return int(v)


def _check_location(loc: str | None, base: Path, fail) -> tuple[Path, os.stat_result]:
    """The resolved file of external-data location ``loc`` inside ``base``
    (already resolved), and its stat."""
    if not loc:
        fail("external data has no location")
    if "\0" in loc:
        fail(f"external data location {loc!r} contains a NUL byte")
    if (os.path.isabs(loc) or loc.startswith(("/", "\\")) or PureWindowsPath(loc).drive):
        fail(f"external data location {loc!r} must be a relative path inside the model's "
             "folder")
    path = Path(os.path.realpath(base / loc))  # every symlink of every component followed
    if path != base and base not in path.parents:
        fail(f"external data location {loc!r} escapes the model's folder {str(base)!r} "
             f"(it resolves to {str(path)!r}); refused")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        fail(f"external data file {str(path)!r} is missing")
    except OSError as e:
        fail(f"external data file {str(path)!r} cannot be read: {e.strerror}")
    if not stat.S_ISREG(st.st_mode):
        fail(f"external data location {loc!r} is not a regular file")
    if st.st_nlink > 1:
        # onnx-ir refuses these when it maps the file: a hard link can bring a
        # file from outside the folder in
        fail(f"external data file {str(path)!r} has {st.st_nlink} hard links; refused "
             "(copy the file instead of linking it)")
    return path, st


def _check_external(t: onnx.TensorProto, base: Path | None, dims, n: int, fail) -> None:
    info: dict[str, str] = {}
    for e in t.external_data:
        if e.key in info:
            fail(f"external data key {e.key!r} appears twice")
        info[e.key] = e.value
    unknown = sorted(set(info) - set(_EXTERNAL_KEYS))
    if unknown:
        fail(f"unknown external data keys {unknown}; expected only {list(_EXTERNAL_KEYS)}")
    if t.data_location != _T.EXTERNAL:
        fail("lists external data but its data_location is not EXTERNAL")
    loc = info.get("location")
    if base is None:
        fail(f"keeps its data in external file {loc!r}, but the model was not given as a "
             "path (bytes and ModelProto models may not reference files); load it from "
             "its file")
    if t.data_type == _T.STRING:
        fail("a string tensor cannot keep its data externally")
    offset = _number(info, "offset", fail) or 0
    length = _number(info, "length", fail)
    path, st = _check_location(loc, base, fail)
    need = _nbytes(t.data_type, n)
    if length is not None and length != need:
        fail(f"external data length {length} does not match the {need} bytes a "
             f"{_type_name(t.data_type)} tensor of shape {dims} needs")
    if offset + need > st.st_size:
        fail(f"external data file {str(path)!r} holds {st.st_size} bytes, tensor needs "
             f"bytes {offset}..{offset + need}")


def _check_tensor(label: str, t: onnx.TensorProto, base: Path | None, model: str) -> None:
    def fail(msg: str):
        raise ModelLoadError(f"{label}: {msg}", model=model)

    dims = list(t.dims)
    if any(d < 0 for d in dims):
        fail(f"shape {dims} has a negative dimension")
    if t.HasField("segment"):
        fail("tensor segments are not supported")
    dt = t.data_type
    if dt != _T.STRING and dt not in _BITS:
        fail("element type is undefined" if dt == _T.UNDEFINED
             else f"unknown element type {dt}")
    n = math.prod(dims)
    if t.data_location == _T.EXTERNAL or len(t.external_data):
        _check_external(t, base, dims, n, fail)
        return
    if dt == _T.STRING:
        if t.HasField("raw_data"):
            fail("a string tensor cannot keep raw_data")
        if len(t.string_data) != n:
            fail(f"string_data holds {len(t.string_data)} strings, shape {dims} needs {n}")
        return
    if t.HasField("raw_data"):
        got, need = len(t.raw_data), _nbytes(dt, n)
        if got != need:
            fail(f"raw_data holds {got} bytes, a {_type_name(dt)} tensor of shape {dims} "
                 f"needs {need}")
        return
    field = onnx.helper.tensor_dtype_to_field(dt)
    got, need = len(getattr(t, field)), _typed_count(dt, n)
    if got != need:
        fail(f"{field} holds {got} values, a {_type_name(dt)} tensor of shape {dims} needs "
             f"{need}")


def check_tensor_protos(proto: onnx.ModelProto, base_dir: Path | None, model: str) -> None:
    """Check every tensor of ``proto`` (see the module docstring).

    Args:
        proto: the model, external data not loaded.
        base_dir: the model's folder, or ``None`` when it was given as bytes or
            a ``ModelProto`` (then any external reference is refused).
        model: the model's display name, for messages.

    Raises:
        ModelLoadError: the first bad tensor, named with where it sits.
    """
    base = Path(os.path.realpath(base_dir)) if base_dir is not None else None
    for label, t in iter_tensor_protos(proto):
        _check_tensor(label, t, base, model)


# ---------------------------------------------------------------- onnx-ir side


def _ir_attr_tensors(node: ir.Node, where: str):
    who = f"node {node.name!r}" if node.name else f"a {node.op_type} node"
    for a in node.attributes.values():
        if a.is_ref():
            continue
        if a.type == ir.AttributeType.TENSOR:
            yield f"the tensor of attribute {a.name!r} of {who}{where}", a.value
        elif a.type == ir.AttributeType.TENSORS:
            for i, t in enumerate(a.value):
                yield f"tensor (item {i}) in attribute {a.name!r} of {who}{where}", t


def _ir_tensors(model: ir.Model):
    graphs: list[tuple[ir.Graph | ir.Function, str]] = [(model.graph, "")]
    graphs += [(g, f" in graph {g.name!r}") for g in model.graph.subgraphs()]
    for f in model.functions.values():
        scope = f" in function '{f.domain}:{f.name}'"
        graphs.append((f, scope))
        graphs += [(g, f" in graph {g.name!r}{scope}") for g in f.subgraphs()]
    for g, scope in graphs:
        if isinstance(g, ir.Graph):
            for v in g.initializers.values():
                if v.const_value is not None:
                    yield f"initializer {v.name!r}{scope}", v.const_value
        for node in g:
            yield from _ir_attr_tensors(node, scope)


def anchor_external_tensors(model: ir.Model, base_dir: Path | None, name: str) -> None:
    """Point every ``ir.ExternalTensor`` of ``model`` at ``base_dir`` and check
    it stays inside its folder.

    Args:
        model: the deserialized model (changed in place).
        base_dir: the model's folder; ``None`` keeps each tensor's own
            ``base_dir`` (an ``onnx_ir.Model`` given by the caller), which
            must then be set.
        name: the model's display name, for messages.

    Raises:
        ModelLoadError: an external tensor without a folder, or one whose
            location escapes it, is missing, or is too short.
    """
    for label, t in _ir_tensors(model):
        if not isinstance(t, ir.ExternalTensor):
            continue

        def fail(msg: str, label=label):
            raise ModelLoadError(f"{label}: {msg}", model=name)

        if base_dir is not None:
            t.base_dir = str(base_dir)
        if not t.base_dir:
            fail(f"external data {str(t.location)!r} has no base folder (it would be read "
                 "relative to the working directory); set the tensor's base_dir")
        base = Path(os.path.realpath(t.base_dir))
        path, st = _check_location(os.fspath(t.location), base, fail)
        offset = t.offset or 0
        if offset < 0:
            fail(f"external data offset {offset} is negative")
        if offset + t.nbytes > st.st_size:
            fail(f"external data file {str(path)!r} holds {st.st_size} bytes, tensor needs "
                 f"bytes {offset}..{offset + t.nbytes}")
