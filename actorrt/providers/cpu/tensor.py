"""Tensor creation and shape/layout kernels.

Reshape, Flatten, Squeeze, Unsqueeze, Transpose, Slice, Expand and Identity
return numpy views of their input (``view_outputs=True``): basic slicing,
``np.reshape`` / ``np.transpose`` / ``np.broadcast_to``. Reshape and Flatten
copy only when the input's strides make a view impossible (numpy's rule).

Spec: ONNX Constant, Reshape, Flatten, Squeeze, Unsqueeze, Transpose, Concat,
Split, Slice, Expand, Identity, Shape, Size, ConstantOfShape, Range, Tile, Pad,
Trilu, EyeLike, ReverseSequence, CumSum, CumProd (every since-version up to
opset 28).
"""

from __future__ import annotations

import math

import numpy as np

from ..._dtypes import to_numpy_dtype
from .._contract import Kernel, NodeSpec, require
from .._memory import check_output_bytes
from ._index_util import as_int, as_ints, as_scalar, norm_axes, norm_axis
from .registry import cpu_kernel

_NO_FLOPS = {"flops": lambda node: 0.0}


# ------------------------------------------------------------------- Constant

def _densify(sparse) -> np.ndarray:
    """Dense array of a sparse tensor given as an object with ``values`` (nnz,),
    ``indices`` ((nnz,) linear or (nnz, rank) coordinates) and ``dims``."""
    values = np.asarray(sparse.values)
    indices = np.asarray(sparse.indices, dtype=np.int64)
    dims = tuple(int(d) for d in sparse.dims)
    out = np.zeros(dims, dtype=values.dtype)
    if indices.ndim == 2 and len(dims) > 0:
        indices = np.ravel_multi_index(tuple(indices.T), dims)
    out.reshape(-1)[indices.reshape(-1)] = values.reshape(-1)
    return out


def _strings(values) -> np.ndarray:
    vals = [v.decode("utf-8") if isinstance(v, bytes) else v for v in values]
    out = np.empty(len(vals), dtype=object)
    out[:] = vals
    return out


def constant_value(attrs: dict) -> np.ndarray:
    """The tensor a Constant node's one ``value*`` attribute describes.

    Raises:
        ValueError: no or several ``value*`` attributes are set.
    """
    keys = [k for k in ("value", "sparse_value", "value_float", "value_floats", "value_int",
                        "value_ints", "value_string", "value_strings") if k in attrs]
    if len(keys) != 1:
        raise ValueError(f"Constant needs exactly one value attribute, got {keys or 'none'}")
    k, v = keys[0], attrs[keys[0]]
    if k == "value":
        return np.asarray(v)
    if k == "sparse_value":
        return _densify(v)
    if k == "value_float":
        return np.asarray(v, dtype=np.float32)
    if k == "value_floats":
        return np.asarray(list(v), dtype=np.float32).reshape(-1)
    if k == "value_int":
        return np.asarray(v, dtype=np.int64)
    if k == "value_ints":
        return np.asarray(list(v), dtype=np.int64).reshape(-1)
    if k == "value_string":
        return _strings([v]).reshape(())
    return _strings(list(v))


@cpu_kernel("Constant", since=(1, 9, 11, 12, 13, 19, 21, 23, 24, 25))
class Constant(Kernel):
    """ONNX Constant (opsets 1-25): the tensor of its ``value*`` attribute
    (``sparse_value`` densified; ``value_float(s)`` float32, ``value_int(s)`` int64)."""

    @classmethod
    def check(cls, node: NodeSpec) -> None:
        try:
            constant_value(node.attrs)
        except (ValueError, AttributeError, TypeError) as e:
            require(False, "Constant: %s", e)

    @classmethod
    def estimate_flops(cls, node: NodeSpec) -> float:
        return 0.0

    def compile(self):
        value = constant_value(self.node.attrs)
        return lambda: value

    def run(self):
        return self.compile()()


# -------------------------------------------------------------- view kernels

def _reshape_target(in_shape: tuple[int, ...], shape, allowzero: int) -> tuple[int, ...]:
    dims = as_ints(shape)
    out = []
    infer = -1
    for i, d in enumerate(dims):
        if d == 0 and not allowzero:
            if i >= len(in_shape):
                raise ValueError(f"Reshape: 0 at position {i} copies a dim the input "
                                 f"{in_shape} lacks")
            d = in_shape[i]
        elif d == -1:
            if infer >= 0:
                raise ValueError(f"Reshape: shape {dims} has more than one -1")
            infer = i
        elif d < 0:
            raise ValueError(f"Reshape: invalid dim {d} in shape {dims}")
        out.append(d)
    total = math.prod(in_shape)
    if infer >= 0:
        known = math.prod(d for i, d in enumerate(out) if i != infer)
        if known == 0 or total % known:
            raise ValueError(f"Reshape: cannot infer -1 reshaping {in_shape} to {dims}")
        out[infer] = total // known
    if math.prod(out) != total:
        raise ValueError(f"Reshape: cannot reshape {in_shape} ({total} elements) to {dims}")
    return tuple(out)


#: (input shape, shape dtype, shape bytes, allowzero) -> target, for int64 shape
#: tensors: a plan reshapes the same few signatures every run
_TARGETS: dict = {}
_TARGETS_MAX = 4096
#: Split: the pieces' index tuples per (input shape, split sizes, axis, counts)
_SPLITS: dict = {}


@cpu_kernel("Reshape", since=(1, 5, 13, 14, 19, 21, 23, 24, 25), view_outputs=True, **_NO_FLOPS)
def Reshape(data, shape=None, *, allowzero=0, node=None):
    """ONNX Reshape (opsets 1-25): ``0`` copies the input dim unless ``allowzero``,
    one ``-1`` is inferred. Shape from the attribute before opset 5. Targets
    are cached per (input shape, shape tensor)."""
    if node is not None and node.opset < 5:
        shape = node.attrs.get("shape", [])
    elif type(shape) is np.ndarray and shape.dtype == np.int64 and shape.ndim == 1:
        key = (data.shape, shape.tobytes(), allowzero)
        target = _TARGETS.get(key)
        if target is None:
            target = _reshape_target(data.shape, shape, allowzero)
            if len(_TARGETS) >= _TARGETS_MAX:
                _TARGETS.clear()
            _TARGETS[key] = target
        return data.reshape(target)
    return np.reshape(data, _reshape_target(data.shape, shape, allowzero))


@cpu_kernel("ReshapeTranspose", domain="ai.actorrt")
class ReshapeTranspose(Kernel):
    """``Transpose(Reshape(data, shape), perm)`` (or, with ``transpose_first``
    1, ``Reshape(Transpose(data, perm), shape)``) as one node: the graph
    optimizer's fusion of such a pair whose middle value nothing else reads
    (:func:`actorrt.optimizer.transformer.fuse_view_pairs`; a transformer's
    head split and merge). Attributes: ``shape`` (ints, ONNX Reshape's: ``0``
    copies the dim unless ``allowzero``, one ``-1`` inferred), ``allowzero``,
    ``perm`` (ints), ``transpose_first``. Any dtype; a view of ``data`` where
    numpy's reshape can make one (as the two ops give). Raises ValueError
    as Reshape / Transpose do."""

    view_outputs = True

    @classmethod
    def estimate_flops(cls, node: NodeSpec) -> float:
        return 0.0

    def __init__(self, node: NodeSpec):
        super().__init__(node)
        self._shape = np.asarray(node.attr("shape", []), np.int64)
        self._allowzero = int(node.attr("allowzero", 0))
        self._perm = tuple(int(v) for v in node.attr("perm", []))
        self._first = bool(node.attr("transpose_first", 0))
        # input shape -> reshape target (a plan sees a few shapes)
        self._targets: dict = {}

    def _reshape(self, x: np.ndarray) -> np.ndarray:
        target = self._targets.get(x.shape)
        return x.reshape(self._reshape_target(x.shape) if target is None else target)

    def run(self, data):
        if self._first:
            return self._reshape(Transpose(data, perm=self._perm))
        return Transpose(self._reshape(data), perm=self._perm)

    def compile(self):
        """One closure doing both views (no method or checking calls between
        them) when ``perm`` is a permutation (else :meth:`run`, whose
        Transpose names the bad perm); numpy still raises for a perm of
        another rank."""
        perm = self._perm
        if sorted(perm) != list(range(len(perm))):
            return self.run
        targets, reshape_target = self._targets, self._reshape_target

        if self._first:
            def transpose_reshape(data):
                t = data.transpose(perm)
                target = targets.get(t.shape)
                if target is None:
                    target = reshape_target(t.shape)
                return t.reshape(target)
            return transpose_reshape

        def reshape_transpose(data):
            target = targets.get(data.shape)
            if target is None:
                target = reshape_target(data.shape)
            return data.reshape(target).transpose(perm)
        return reshape_transpose

    def _reshape_target(self, shape) -> tuple[int, ...]:
        target = _reshape_target(shape, self._shape, self._allowzero)
        if len(self._targets) >= 64:
            self._targets.clear()
        self._targets[shape] = target
        return target


@cpu_kernel("Flatten", since=(1, 9, 11, 13, 21, 23, 24, 25), view_outputs=True, **_NO_FLOPS)
def Flatten(input, *, axis=1):
    """ONNX Flatten (opsets 1-25): 2-D ``(prod(shape[:axis]), prod(shape[axis:]))``,
    axis in ``[-rank, rank]``."""
    r = input.ndim
    if not -r <= axis <= r:
        raise ValueError(f"Flatten: axis {axis} out of range for rank {r}")
    axis = axis + r if axis < 0 else axis
    return np.reshape(input, (math.prod(input.shape[:axis]), math.prod(input.shape[axis:])))


@cpu_kernel("Squeeze", since=(1, 11, 13, 21, 23, 24, 25), view_outputs=True, **_NO_FLOPS)
def Squeeze(data, axes=None, *, node=None):
    """ONNX Squeeze (opsets 1-25): drops the listed size-1 axes (all size-1 axes
    when none are given); axes from the attribute before opset 13."""
    if node is not None and node.opset < 13:
        axes = node.attrs.get("axes")
    if axes is None:
        return np.squeeze(data)
    ax = norm_axes(as_ints(axes), data.ndim, what="Squeeze axes")
    for a in ax:
        if data.shape[a] != 1:
            raise ValueError(f"Squeeze: axis {a} of shape {data.shape} is not 1")
    return np.squeeze(data, axis=ax)


@cpu_kernel("Unsqueeze", since=(1, 11, 13, 21, 23, 24, 25), view_outputs=True, **_NO_FLOPS)
def Unsqueeze(data, axes=None, *, node=None):
    """ONNX Unsqueeze (opsets 1-25): inserts size-1 axes at ``axes`` of the output
    (negative ones count from the output's end); axes attribute before opset 13."""
    if node is not None and node.opset < 13:
        axes = node.attrs.get("axes")
    if axes is None:
        raise ValueError("Unsqueeze needs axes")
    ax = norm_axes(as_ints(axes), data.ndim + len(as_ints(axes)), what="Unsqueeze axes")
    return np.expand_dims(data, ax)


@cpu_kernel("Transpose", since=(1, 13, 21, 23, 24, 25), view_outputs=True, **_NO_FLOPS)
def Transpose(data, *, perm=None):
    """ONNX Transpose (opsets 1-25): permutes axes (reverses them by default); a view."""
    if perm is None:
        return data.transpose()
    try:  # numpy checks length, range and repeats; negative axes (numpy's) are not ONNX's
        if not perm or min(perm) >= 0:
            return data.transpose(perm)
    except (ValueError, TypeError):
        pass
    raise ValueError(f"Transpose: perm {list(perm)} is not a permutation of rank {data.ndim}")


def _slice_key(shape, starts, ends, axes, steps) -> tuple:
    rank = len(shape)
    starts, ends = as_ints(starts), as_ints(ends)
    axes = list(range(len(starts))) if axes is None else as_ints(axes)
    steps = [1] * len(starts) if steps is None else as_ints(steps)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ValueError(f"Slice: starts/ends/axes/steps lengths differ: {len(starts)}, "
                         f"{len(ends)}, {len(axes)}, {len(steps)}")
    key = [slice(None)] * rank
    for a, s, e, st in zip(norm_axes(axes, rank, what="Slice axes"), starts, ends, steps):
        d = shape[a]
        if st == 0:
            raise ValueError("Slice: step 0")
        s = s + d if s < 0 else s
        e = e + d if e < 0 else e
        if st > 0:
            s, e = min(max(s, 0), d), min(max(e, 0), d)
        else:
            s, e = max(min(s, d - 1), 0), min(max(e, -1), d - 1)
        key[a] = slice(s, None if e < 0 else e, st)
    return tuple(key)


@cpu_kernel("Slice", since=(1, 10, 11, 13), view_outputs=True, **_NO_FLOPS)
def Slice(data, starts=None, ends=None, axes=None, steps=None, *, node=None):
    """ONNX Slice (opsets 1-13): numpy basic slicing with ONNX clamping, negative
    steps; starts/ends/axes attributes at opset 1."""
    if node is not None and node.opset < 10:
        starts, ends, axes = node.attrs["starts"], node.attrs["ends"], node.attrs.get("axes")
    return data[_slice_key(data.shape, starts, ends, axes, steps)]


@cpu_kernel("Expand", since=(8, 13), view_outputs=True, **_NO_FLOPS)
def Expand(input, shape):
    """ONNX Expand (opsets 8, 13): bidirectional broadcast to ``shape``; a read-only view."""
    target = np.broadcast_shapes(input.shape, tuple(as_ints(shape)))
    return np.broadcast_to(input, target)


@cpu_kernel("Identity", since=(1, 13, 14, 16, 19, 21, 23, 24, 25), view_outputs=True,
            **_NO_FLOPS)
def Identity(input):
    """ONNX Identity (opsets 1-25): the input itself (tensor, sequence or optional)."""
    return input


# ------------------------------------------------------------ joins & splits

@cpu_kernel("Concat", since=(1, 4, 11, 13))
def Concat(*inputs, axis=None, node=None):
    """ONNX Concat (opsets 1-13): joins along ``axis`` (default 1 at opset 1)."""
    if axis is None:
        if node is not None and node.opset >= 4:
            raise ValueError("Concat needs the axis attribute")
        axis = 1
    if not inputs:
        raise ValueError("Concat needs at least one input")
    if type(axis) is int and -inputs[0].ndim <= axis < inputs[0].ndim:
        return np.concatenate(inputs, axis=axis)  # numpy takes ONNX's axis range as it is
    return np.concatenate(inputs, axis=norm_axis(axis, inputs[0].ndim, what="Concat axis"))


@cpu_kernel("Split", since=(1, 2, 11, 13, 18), multi_output=True)
def Split(input, split=None, *, axis=0, num_outputs=None, node=None):
    """ONNX Split (opsets 1-18): pieces given by ``split`` (attribute before opset
    13), else ``num_outputs`` chunks of ``ceil(dim / n)`` (last smaller), else
    equal parts, one per output."""
    n_out = node.num_outputs if node is not None else num_outputs
    if node is not None and node.opset < 13 and split is None:
        split = node.attrs.get("split")
    key = None
    if split is None or (type(split) is np.ndarray and split.dtype == np.int64):
        # the pieces' index tuples per (shape, sizes, axis, counts), as Reshape's targets
        key = (input.shape, None if split is None else split.tobytes(), axis, num_outputs, n_out)
        keys = _SPLITS.get(key)
        if keys is not None:
            return tuple([input[k] for k in keys])
    ax = norm_axis(axis, input.ndim, what="Split axis")
    dim = input.shape[ax]
    if split is not None and len(as_ints(split)) > 0:
        sizes = as_ints(split)
        if sum(sizes) != dim or any(s < 0 for s in sizes):
            raise ValueError(f"Split: sizes {sizes} do not add up to dim {dim}")
    else:
        n = num_outputs if num_outputs is not None else n_out
        if num_outputs is not None:
            chunk = -(-dim // n)
            sizes = [min(chunk, max(dim - i * chunk, 0)) for i in range(n)]
        else:
            if dim % n:
                raise ValueError(f"Split: dim {dim} is not divisible into {n} equal parts")
            sizes = [dim // n] * n
    # views by basic slicing (np.split's per-piece swapaxes cost ~10x more)
    lead = (slice(None),) * ax
    keys = []
    lo = 0
    for n in sizes:
        keys.append(lead + (slice(lo, lo + n),))
        lo += n
    if key is not None:
        if len(_SPLITS) >= _TARGETS_MAX:
            _SPLITS.clear()
        _SPLITS[key] = tuple(keys)
    return tuple([input[k] for k in keys])


# ------------------------------------------------------------ shape queries

@cpu_kernel("Shape", since=(1, 13, 15, 19, 21, 23, 24, 25), **_NO_FLOPS)
def Shape(data, *, start=0, end=None):
    """ONNX Shape (opsets 1-25): int64 1-D shape, sliced by ``start``/``end``
    (clamped to ``[0, rank]``)."""
    r = data.ndim
    s = start + r if start < 0 else start
    e = r if end is None else (end + r if end < 0 else end)
    s, e = min(max(s, 0), r), min(max(e, 0), r)
    return np.array(data.shape[s:e], dtype=np.int64)


@cpu_kernel("Size", since=(1, 13, 19, 21, 23, 24, 25), **_NO_FLOPS)
def Size(data):
    """ONNX Size (opsets 1-25): int64 scalar element count."""
    return np.asarray(data.size, dtype=np.int64)


# ---------------------------------------------------------------- generators

@cpu_kernel("ConstantOfShape", since=(9, 20, 21, 23, 24, 25))
def ConstantOfShape(input, *, value=None):
    """ONNX ConstantOfShape (opsets 9-25): ``shape`` filled with the one-element
    ``value`` (float32 0 by default)."""
    shape = as_ints(input)
    if any(d < 0 for d in shape):
        raise ValueError(f"ConstantOfShape: negative dim in {shape}")
    check_output_bytes(shape, np.float32 if value is None else value.dtype,
                       what="ConstantOfShape output")
    if value is None:
        return np.zeros(shape, dtype=np.float32)
    return np.full(shape, as_scalar(value), dtype=value.dtype)


_LOW_PRECISION = {np.dtype(np.float16)}
try:
    import ml_dtypes
    _LOW_PRECISION.add(np.dtype(ml_dtypes.bfloat16))
except ImportError:  # pragma: no cover
    pass


@cpu_kernel("Range", since=(11, 27))
def Range(start, limit, delta, *, stash_type=1, node=None):
    """ONNX Range (opsets 11, 27): ``start + i * delta`` for
    ``i < max(ceil((limit - start) / delta), 0)``; float16/bfloat16 computed in
    float32 (``stash_type`` 1) or float64 (11)."""
    dtype = np.asarray(start).dtype
    s, l, d = as_scalar(start), as_scalar(limit), as_scalar(delta)
    if dtype.kind in "iu":
        s, l, d = int(s), int(l), int(d)
        if d == 0:
            raise ValueError("Range: delta is 0")
        n = max(-((s - l) // d), 0)
        check_output_bytes((n,), np.int64, what="Range output")
        return (s + np.arange(n, dtype=np.int64) * d).astype(dtype)
    comp = np.float64
    if dtype in _LOW_PRECISION and node is not None and node.opset >= 27:
        comp = np.float32 if stash_type == 1 else np.float64
    s, l, d = comp(s), comp(l), comp(d)
    if d == 0:
        raise ValueError("Range: delta is 0")
    n = max(int(np.ceil((l - s) / d)), 0)
    check_output_bytes((n,), comp, what="Range output")
    return (s + np.arange(n, dtype=comp) * d).astype(dtype)


@cpu_kernel("EyeLike", since=(9, 22))
def EyeLike(input, *, dtype=None, k=0):
    """ONNX EyeLike (opsets 9, 22): 2-D identity-like tensor with ones on diagonal
    ``k``, of ``dtype`` (default: the input's)."""
    if input.ndim != 2:
        raise ValueError(f"EyeLike needs a 2-D input, got shape {input.shape}")
    dt = input.dtype if dtype is None else to_numpy_dtype(dtype)
    return np.eye(input.shape[0], input.shape[1], k=k, dtype=dt)


# -------------------------------------------------------------- rearranging

@cpu_kernel("Tile", since=(1, 6, 13))
def Tile(input, repeats, axis=None, *, node=None):
    """ONNX Tile (opsets 1-13): ``np.tile`` with one repeat per axis (opset 1:
    ``tiles`` copies along ``axis``)."""
    if node is not None and node.opset < 6:
        reps = [1] * input.ndim
        reps[norm_axis(as_int(axis), input.ndim)] = as_int(repeats)
    else:
        reps = as_ints(repeats)
    if len(reps) != input.ndim or any(r < 0 for r in reps):
        raise ValueError(f"Tile: repeats {reps} do not fit rank {input.ndim}")
    check_output_bytes([d * r for d, r in zip(input.shape, reps)], input.dtype,
                       what="Tile output")
    return np.tile(input, reps)


_PAD_MODES = {"constant": "constant", "reflect": "reflect", "edge": "edge", "wrap": "wrap"}


@cpu_kernel("Pad", since=(1, 2, 11, 13, 18, 19, 21, 23, 24, 25))
def Pad(data, pads=None, constant_value=None, axes=None, *, mode="constant", value=0.0,
        node=None):
    """ONNX Pad (opsets 1-25): constant / reflect / edge / wrap padding,
    ``pads = [begin..., end...]`` over ``axes``; negative pads crop first.
    ``pads``/``value`` are attributes before opset 11."""
    opset = node.opset if node is not None else 25
    if isinstance(mode, bytes):
        mode = mode.decode()
    if opset < 11:
        pads = node.attrs.get("pads", node.attrs.get("paddings"))
        fill = value
    else:
        fill = as_scalar(constant_value) if constant_value is not None and \
            np.asarray(constant_value).size else ("" if data.dtype == object else 0)
    if mode not in _PAD_MODES or (mode == "wrap" and opset < 19):
        raise ValueError(f"Pad: unsupported mode {mode!r} at opset {opset}")
    r = data.ndim
    p = as_ints(pads)
    ax = list(range(r)) if axes is None else list(norm_axes(as_ints(axes), r, what="Pad axes"))
    if len(p) != 2 * len(ax):
        raise ValueError(f"Pad: {len(p)} pads for {len(ax)} axes")
    width = [[0, 0] for _ in range(r)]
    for i, a in enumerate(ax):
        width[a] = [p[i], p[i + len(ax)]]
    if any(b < 0 or e < 0 for b, e in width):
        key = tuple(slice(max(-b, 0), data.shape[i] - max(-e, 0)) for i, (b, e) in enumerate(width))
        data = data[key]
        width = [[max(b, 0), max(e, 0)] for b, e in width]
    if not any(b or e for b, e in width):
        return data.copy()
    if mode == "constant":
        fill = np.asarray(fill).astype(data.dtype)
        return np.pad(data, width, mode="constant", constant_values=fill)
    if data.size == 0:
        raise ValueError(f"Pad: mode {mode!r} cannot pad an empty tensor {data.shape}")
    return np.pad(data, width, mode=_PAD_MODES[mode])


@cpu_kernel("Trilu", since=14)
def Trilu(input, k=None, *, upper=1):
    """ONNX Trilu (opset 14): upper/lower triangle of the last two axes, diagonal ``k``."""
    if input.ndim < 2:
        raise ValueError(f"Trilu needs rank >= 2, got shape {input.shape}")
    kk = 0 if k is None else as_int(k)
    return np.triu(input, kk) if upper else np.tril(input, kk)


@cpu_kernel("ReverseSequence", since=(10, 28))
def ReverseSequence(input, sequence_lens, *, batch_axis=1, time_axis=0):
    """ONNX ReverseSequence (opsets 10, 28): reverses the first ``sequence_lens[b]``
    steps along ``time_axis`` for each ``b`` along ``batch_axis``."""
    b_ax, t_ax = norm_axis(batch_axis, input.ndim), norm_axis(time_axis, input.ndim)
    if b_ax == t_ax:
        raise ValueError("ReverseSequence: batch_axis equals time_axis")
    x = np.moveaxis(input, (b_ax, t_ax), (0, 1))
    nb, nt = x.shape[:2]
    lens = np.asarray(sequence_lens, dtype=np.int64).reshape(-1)
    if lens.shape[0] != nb or (lens.size and (lens.min() < 0 or lens.max() > nt)):
        raise ValueError(f"ReverseSequence: sequence_lens {lens.tolist()} invalid for batch "
                         f"{nb}, time {nt}")
    t = np.arange(nt, dtype=np.int64)[None, :]
    src = np.where(t < lens[:, None], lens[:, None] - 1 - t, t)
    y = x[np.arange(nb)[:, None], src]
    return np.moveaxis(y, (0, 1), (b_ax, t_ax))


def _cumulative(x, axis, exclusive, reverse, ufunc, identity):
    ax = norm_axis(as_int(axis), x.ndim, what="axis")
    if reverse:
        x = np.flip(x, ax)
    y = ufunc.accumulate(x, axis=ax, dtype=x.dtype)
    if exclusive:
        out = np.empty_like(y)
        lead = [slice(None)] * x.ndim
        lead[ax] = slice(0, 1)
        out[tuple(lead)] = identity
        rest = [slice(None)] * x.ndim
        rest[ax] = slice(1, None)
        head = [slice(None)] * x.ndim
        head[ax] = slice(0, -1)
        out[tuple(rest)] = y[tuple(head)]
        y = out
    if reverse:
        y = np.flip(y, ax)
    return np.ascontiguousarray(y)


@cpu_kernel("CumSum", since=(11, 14))
def CumSum(x, axis, *, exclusive=0, reverse=0):
    """ONNX CumSum (opsets 11, 14): running sum along ``axis`` (0-d or 1-element
    tensor), optionally exclusive and/or reversed."""
    return _cumulative(x, axis, exclusive, reverse, np.add, 0)


@cpu_kernel("CumProd", since=26)
def CumProd(x, axis, *, exclusive=0, reverse=0):
    """ONNX CumProd (opset 26): running product along ``axis``, optionally
    exclusive (starts at 1) and/or reversed."""
    return _cumulative(x, axis, exclusive, reverse, np.multiply, 1)
