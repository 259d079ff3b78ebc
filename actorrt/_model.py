"""Loading models: a path, bytes, an ``onnx.ModelProto`` or an ``onnx_ir.Model``
becomes an ``onnx_ir.Model`` with functions inlined, unused nodes removed, nodes
sorted topologically and shapes inferred (onnx's inference; symbolic dims are
resolved at run time).

Before anything reads a tensor, every tensor the model carries is checked
(:mod:`actorrt._loading.tensors`): inline data of the right size; external
data only for a model loaded from a path, at a relative location that stays
inside the model's folder (symlinks resolved) and within the file. External
data is then memory-mapped by onnx-ir.
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
from ._loading.contrib_types import infer_through_contrib_ops
from ._loading.graph import check_graph_protos, run_onnx_checker
from ._loading.nchwc import expand_nchwc
from ._loading.tensors import anchor_external_tensors, check_tensor_protos

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
        ModelLoadError: unreadable or malformed model; a tensor whose data is
            short, or external, escaping, missing or truncated; an invalid
            graph (:mod:`actorrt._loading.graph`: undefined values, values
            assigned twice, control-flow bodies that do not bind, what onnx's
            checker refuses); or a graph onnx-ir cannot represent.
    """
    if isinstance(model, ir.Model):
        name = model.graph.name or "<onnx_ir.Model>"
        m = model
        base_dir = None
        anchor_external_tensors(m, None, name)
        try:
            proto = ir.serde.serialize_model(m)  # external tensors stay references
        except Exception as e:
            raise ModelLoadError(f"cannot serialize the onnx_ir model: {e}", model=name) from e
        check_graph_protos(proto, name)
        run_onnx_checker(proto, proto, name)
    else:
        proto, name, base_dir = _proto_from(model)
        if not proto.HasField("graph"):
            raise ModelLoadError("the model has no graph", model=name)
        check_tensor_protos(proto, base_dir, name)
        check_graph_protos(proto, name)
        source = (str(model) if isinstance(model, (str, os.PathLike))
                  else model if isinstance(model, (bytes, onnx.ModelProto)) else bytes(model))
        run_onnx_checker(source, proto, name)
        try:
            m = ir.serde.deserialize_model(proto)
        except Exception as e:
            raise ModelLoadError(f"cannot read the model's graph: {e}", model=name) from e
    # every external tensor (functions' Constant values too) anchored at the
    # model's folder and checked again, before any pass can read one
    anchor_external_tensors(m, base_dir, name)
    try:
        m = common_passes.InlinePass()(m).model
        m = common_passes.RemoveUnusedFunctionsPass()(m).model
        m = common_passes.TopologicalSortPass()(m).model
    except Exception as e:
        raise ModelLoadError(f"graph passes failed: {e}", model=name) from e
    anchor_external_tensors(m, base_dir, name)  # tensors the passes copied
    _import_microsoft_domain(m)
    expand_nchwc(m, name)  # files saved at ORT_ENABLE_ALL
    if infer_shapes:
        try:
            m = common_passes.ShapeInferencePass(strict_mode=False)(m).model
        except Exception:
            # Shape inference is advisory: kernels see runtime shapes.
            pass
        infer_through_contrib_ops(m)  # onnx stops at com.microsoft nodes
    return LoadedModel(m, name, base_dir)


def _import_microsoft_domain(m: ir.Model) -> None:
    """Import com.microsoft at version 1 when nodes use it without an import,
    as onnxruntime does (the checker's finding is tolerated for it)."""
    if "com.microsoft" in m.opset_imports:
        return
    if any(n.domain == "com.microsoft" for n in ir.traversal.RecursiveGraphIterator(m.graph)):
        m.opset_imports["com.microsoft"] = 1
