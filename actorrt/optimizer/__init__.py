"""Graph optimizations: rewrite passes over a plan's node list before placement.

Like onnxruntime's graph transformers, passes run after constant folding (so
parameters computed by ``ConstantOfShape``/``Unsqueeze`` chains are plain
constants) and replace node groups with fewer, fused nodes. Results equal the
original graph's within float rounding; every pass states its preconditions
and leaves the graph's outputs, their names and types unchanged.

Levels (``SessionOptions.graph_optimization_level``, onnxruntime's names):

* ``0`` ``ORT_DISABLE_ALL`` / ``"disabled"``: no rewrites.
* ``1`` ``ORT_ENABLE_BASIC`` / ``"basic"``: semantics-preserving folds into
  standard ops: Identity and inference Dropout removed, Transpose pairs, Reshape
  chains, 2-D Transposes into Gemm's
  transA / transB (:mod:`.transformer`); Conv + BatchNormalization /
  per-channel Mul / Add (:mod:`.conv`).
* ``2`` ``ORT_ENABLE_EXTENDED`` / ``"extended"``: also fusions into contrib /
  engine ops:
  Conv [+ Add] + activation -> ``com.microsoft:FusedConv`` (:mod:`.conv`),
  BatchNormalization [+ per-channel Mul / Add] [+ activation] ->
  ``ai.actorrt:ChannelAffine``
  (:mod:`.conv`), the Erf GELU -> ``com.microsoft:Gelu`` (:mod:`.transformer`),
  MatMul + bias Add [+ Gelu / Relu] -> ``ai.actorrt:MatMulEpilogue``
  (:mod:`.transformer`), Add + LayerNormalization ->
  ``com.microsoft:SkipLayerNormalization`` (:mod:`.transformer`),
  MatMul - scale - [Add mask] - Softmax - MatMul ->
  ``ai.actorrt:ScaledDotAttention`` (:mod:`.transformer`), Reshape /
  Transpose pairs -> ``ai.actorrt:ReshapeTranspose`` (:mod:`.transformer`); shape-only node
  groups (``Shape`` / ``Gather`` / ``Concat`` ... chains) ->
  ``ai.actorrt:ShapeSubgraph``, run once per input signature (:mod:`.shapes`).
* ``99`` ``ORT_ENABLE_ALL`` / ``"all"`` (the default): also the layout pass:
  chains of convolutions and pools on 16-channel blocks (NCHWc) between
  ``ai.actorrt:ReorderInput`` / ``ReorderOutput`` (:mod:`.layout`; AVX-512
  hosts).

Map:

* :mod:`._graph` -- :class:`OptContext` (producer / consumer maps by value
  name, constants, new-constant registration, fusion log) and the
  chain-replacement helper every pass uses.
* :mod:`.conv` -- convolution and per-channel affine passes.
* :mod:`.transformer` -- GELU, MatMul epilogue, skip-LayerNorm, attention;
  Transpose / Reshape cancellation.
* :mod:`.shapes` -- shape subgraphs cached per input signature.
* :mod:`.layout` -- the NCHWc layout pass.

Entry point: :func:`optimize`, called by the plan compiler
(:mod:`actorrt._plan`) with the folded node list.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ._graph import OptContext
from . import conv, layout, shapes, transformer

__all__ = ["optimize", "parse_level", "LEVELS", "OptContext"]

#: onnxruntime's GraphOptimizationLevel values and our short names
LEVELS = {"ORT_DISABLE_ALL": 0, "ORT_ENABLE_BASIC": 1, "ORT_ENABLE_EXTENDED": 2,
          "ORT_ENABLE_LAYOUT": 3, "ORT_ENABLE_ALL": 99,
          "disabled": 0, "basic": 1, "extended": 2, "layout": 3, "all": 99}

#: (level at which it runs, pass) in order
PASSES: tuple[tuple[int, Callable[[OptContext], None]], ...] = (
    (1, transformer.cancel_transposes),
    (1, transformer.eliminate_identities),
    (1, transformer.collapse_reshapes),
    (1, transformer.fold_transpose_into_gemm),
    (1, conv.fold_conv_affine),
    (2, transformer.fuse_gelu),
    (2, transformer.fuse_attention),
    (2, transformer.fuse_matmul_epilogue),
    (2, transformer.fuse_skip_layer_norm),
    (2, transformer.fuse_view_pairs),
    (2, conv.fuse_conv_activation),
    (2, conv.fuse_affine_activation),
    (2, shapes.cache_shape_subgraphs),
    (3, layout.nchwc_layout),
)


def parse_level(level: Any) -> int:
    """A graph optimization level as an int (0, 1, 2, 3 or 99).

    Accepts ints, onnxruntime's ``GraphOptimizationLevel`` enum members (or
    their names, e.g. ``"ORT_ENABLE_ALL"``) and ``"disabled"`` / ``"basic"``
    / ``"extended"`` / ``"all"``.

    Raises:
        ValueError: any other value.
    """
    if isinstance(level, bool):
        raise ValueError(f"graph_optimization_level must be a level, not {level!r}")
    if isinstance(level, int) and level in (0, 1, 2, 3, 99):
        return int(level)
    name = getattr(level, "name", None) or (level if isinstance(level, str) else None)
    if isinstance(name, str):
        key = name.split(".")[-1]
        if key in LEVELS:
            return LEVELS[key]
        if key.lower() in LEVELS:
            return LEVELS[key.lower()]
    if not isinstance(level, str):
        try:
            as_int = int(level)
        except (TypeError, ValueError):
            as_int = None
        if as_int in (0, 1, 2, 3, 99):
            return as_int
    raise ValueError(f"graph_optimization_level {level!r} is not one of 0, 1, 2, 99, "
                     f"{', '.join(repr(k) for k in LEVELS)}")


def optimize(specs: Sequence[Any], level: int, protected: set[str], consts: dict[str, Any],
             add_const: Callable[[str, Any], str]) -> tuple[list, list[tuple[str, tuple[str, ...]]]]:
    """Run the passes of ``level`` over ``specs`` (NodeSpecs in execution order).

    Args:
        specs: the plan's nodes after constant folding.
        level: from :func:`parse_level`.
        protected: value names read outside ``specs`` (graph outputs, subgraph
            captures); never removed or renamed.
        consts: value name -> constant array (read only).
        add_const: registers a new constant array under a fresh name derived
            from the hint and returns that name.

    Returns:
        ``(new specs, fusions)``; each fusion is ``(new node name, replaced
        node names)``.
    """
    ctx = OptContext(list(specs), protected, consts, add_const)
    for lvl, p in PASSES:
        if level >= lvl:
            p(ctx)
    return ctx.specs, ctx.fusions
