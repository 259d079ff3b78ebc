"""Loading models: a path, bytes, an ``onnx.ModelProto`` or an ``onnx_ir.Model``
becomes an ``onnx_ir.Model`` with functions inlined, unused nodes removed, nodes
sorted topologically and shapes inferred (onnx's inference; symbolic dims are
resolved at run time).

External data is memory-mapped by onnx-ir; every location is checked first: it
must be a relative path inside the model's folder and the file must hold the
bytes the tensor claims.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Union

import attrs
import onnx
import onnx_ir as ir
import onnx_ir.passes.common as common_passes

from ._errors import ModelLoadError

ModelLike = Union[str, os.PathLike, bytes, onnx.ModelProto, ir.Model]

__all__ = ["LoadedModel", "load_model", "ModelLike"]


@attrs.define
class LoadedModel:
    """A model ready to compile.

    Attributes:
        model: the onnx-ir model (passes applied).
        name: a display name for messages (the file name, or the graph name).
        base_dir: folder external data is read from, or ``None``.
    """

    model: ir.Model
    name: str
    base_dir: Path | None


def _iter_tensor_protos(graph: onnx.GraphProto):
    yield from graph.initializer
    for node in graph.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                yield a.t
            elif a.type == onnx.AttributeProto.TENSORS:
                yield from a.tensors
            elif a.type == onnx.AttributeProto.GRAPH:
                yield from _iter_tensor_protos(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    yield from _iter_tensor_protos(g)


def _check_external_data(proto: onnx.ModelProto, base_dir: Path | None, name: str) -> None:
    """Refuse external data that is missing, truncated or escapes ``base_dir``."""
    for t in _iter_tensor_protos(proto.graph):
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in t.external_data}
        loc = info.get("location", "")
        if base_dir is None:
            raise ModelLoadError(
                f"initializer {t.name!r} keeps its data in external file {loc!r}, "
                "but the model was not given as a path; load it from its file",
                model=name)
        if not loc or os.path.isabs(loc) or loc.startswith(("/", "\\")):
            raise ModelLoadError(
                f"initializer {t.name!r}: external data location {loc!r} must be a "
                "relative path inside the model's folder", model=name)
        base = base_dir.resolve()
        path = (base / loc).resolve()
        if base != path and base not in path.parents:
            raise ModelLoadError(
                f"initializer {t.name!r}: external data location {loc!r} escapes the "
                f"model's folder {str(base)!r}; refused", model=name)
        if not path.is_file():
            raise ModelLoadError(
                f"initializer {t.name!r}: external data file {str(path)!r} is missing",
                model=name)
        offset = int(info.get("offset", 0) or 0)
        length = info.get("length")
        size = path.stat().st_size
        if length is not None and offset + int(length) > size:
            raise ModelLoadError(
                f"initializer {t.name!r}: external data file {str(path)!r} holds "
                f"{size} bytes, tensor needs bytes {offset}..{offset + int(length)}",
                model=name)


def _proto_from(model: ModelLike) -> tuple[onnx.ModelProto, str, Path | None]:
    if isinstance(model, (str, os.PathLike)):
        path = Path(model)
        if not path.is_file():
            raise ModelLoadError(f"model file {str(path)!r} does not exist", model=str(path))
        try:
            proto = onnx.load(str(path), load_external_data=False)
        except Exception as e:  # protobuf DecodeError and friends
            raise ModelLoadError(f"cannot parse {str(path)!r} as an ONNX model: {e}",
                                 model=path.name) from e
        return proto, path.name, path.parent
    if isinstance(model, (bytes, bytearray, memoryview)):
        try:
            proto = onnx.load_from_string(bytes(model))
        except Exception as e:
            raise ModelLoadError(f"cannot parse {len(model)} bytes as an ONNX model: {e}",
                                 model="<bytes>") from e
        if not proto.HasField("graph") and len(model) > 0:
            raise ModelLoadError("the bytes parse, but hold no graph", model="<bytes>")
        return proto, proto.graph.name or "<bytes>", None
    if isinstance(model, onnx.ModelProto):
        return model, model.graph.name or "<ModelProto>", None
    raise ModelLoadError(f"cannot load a model from a {type(model).__name__}; pass a path, "
                         "bytes, an onnx.ModelProto or an onnx_ir.Model")


def load_model(model: ModelLike, *, infer_shapes: bool = True) -> LoadedModel:
    """Load and normalise a model.

    Args:
        model: a file path, serialized bytes, an ``onnx.ModelProto`` or an
            ``onnx_ir.Model``.
        infer_shapes: run onnx shape inference (failures are tolerated: the
            engine resolves shapes at run time).

    Raises:
        ModelLoadError: unreadable or malformed model, missing or escaping
            external data, or a graph onnx-ir cannot represent.
    """
    if isinstance(model, ir.Model):
        name = model.graph.name or "<onnx_ir.Model>"
        m = model
        base_dir = None
    else:
        proto, name, base_dir = _proto_from(model)
        if not proto.HasField("graph"):
            raise ModelLoadError("the model has no graph", model=name)
        _check_external_data(proto, base_dir, name)
        try:
            m = ir.serde.deserialize_model(proto)
        except Exception as e:
            raise ModelLoadError(f"cannot read the model's graph: {e}", model=name) from e
        if base_dir is not None:
            _set_base_dir(m.graph, str(base_dir))
    try:
        m = common_passes.InlinePass()(m).model
        m = common_passes.RemoveUnusedFunctionsPass()(m).model
        m = common_passes.TopologicalSortPass()(m).model
    except Exception as e:
        raise ModelLoadError(f"graph passes failed: {e}", model=name) from e
    if infer_shapes:
        try:
            m = common_passes.ShapeInferencePass(strict_mode=False)(m).model
        except Exception:
            # Shape inference is advisory: kernels see runtime shapes.
            pass
    return LoadedModel(m, name, base_dir)


def _set_base_dir(graph: ir.Graph, base_dir: str) -> None:
    """Point every external tensor (subgraphs too) at ``base_dir``."""
    for g in [graph, *graph.subgraphs()]:
        for v in g.initializers.values():
            t = v.const_value
            if isinstance(t, ir.ExternalTensor) and not t.base_dir:
                t.base_dir = base_dir
