"""The kernel contract every execution provider's kernels follow.

A provider answers ``supports_op(node)`` for each node with a :data:`KernelMatch`:
:class:`Supported` (with a :class:`Cost` estimate and the layouts it needs) or
:class:`Unsupported` (with a reason a person can act on). Kernels express their
preconditions with :func:`require` / :func:`deny`, so a reason is formatted only
on the decline path.

A kernel instance is built once per node when a session compiles its plan
(:class:`Kernel`), may prepack its constant inputs once (:meth:`Kernel.prepare`),
and is then called with numpy arrays (or provider buffers) on the hot path.
"""

from __future__ import annotations

import inspect
import math
from functools import partial
from typing import Any, Callable, ClassVar, Mapping, Sequence

import attrs
import numpy as np

from .._dtypes import storage_bits

__all__ = [
    "Cost", "Supported", "Unsupported", "KernelMatch", "Decline", "require", "deny",
    "CaptureSupport", "capture_supported", "capture_unsupported", "WorkspaceRequest",
    "ValueType", "NodeSpec", "Kernel", "FunctionKernel", "KernelSizedOutput",
    "estimate_bytes", "Layout", "DeviceProfile", "function_kernel_class",
]


# --------------------------------------------------------------------------- cost

@attrs.frozen
class Cost:
    """Estimated cost of running one node on one provider, in microseconds.

    Attributes:
        compute_us: arithmetic time (µs).
        memory_us: time to stream inputs and outputs through memory (µs).
        transfer_us: time to move inputs across a provider boundary (µs).
        launch_us: fixed dispatch / launch overhead (µs).
        bytes_moved: bytes read plus written (bytes).
    """

    compute_us: float = 0.0
    memory_us: float = 0.0
    transfer_us: float = 0.0
    launch_us: float = 0.0
    bytes_moved: int = 0

    @property
    def total_us(self) -> float:
        """Total estimated time in µs: compute and memory overlap (max), then
        transfer and launch add."""
        return max(self.compute_us, self.memory_us) + self.transfer_us + self.launch_us

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(self.compute_us + other.compute_us, self.memory_us + other.memory_us,
                    self.transfer_us + other.transfer_us, self.launch_us + other.launch_us,
                    self.bytes_moved + other.bytes_moved)

    def with_transfer(self, transfer_us: float) -> "Cost":
        """A copy with ``transfer_us`` added (µs)."""
        return attrs.evolve(self, transfer_us=self.transfer_us + transfer_us)

    @classmethod
    def of_work(cls, *, flops: float, bytes_moved: int, gflops: float, gbytes_per_s: float,
                launch_us: float) -> "Cost":
        """Cost of ``flops`` floating-point operations and ``bytes_moved`` bytes on a
        device doing ``gflops`` GFLOP/s and ``gbytes_per_s`` GB/s."""
        return cls(compute_us=flops / (gflops * 1e3), memory_us=bytes_moved / (gbytes_per_s * 1e3),
                   launch_us=launch_us, bytes_moved=int(bytes_moved))


# -------------------------------------------------------------------- match types

#: Layout names: ``"strided"`` accepts any strided view (negative strides, byte
#: offsets); ``"contiguous"`` needs C-contiguous memory.
Layout = str


@attrs.frozen
class Supported:
    """The provider can run the node.

    Attributes:
        cost: estimated cost on this provider.
        required_input_layouts: one :data:`Layout` per input (empty: all strided).
        output_layouts: one :data:`Layout` per output (empty: all contiguous).
    """

    cost: Cost
    required_input_layouts: tuple[Layout, ...] = ()
    output_layouts: tuple[Layout, ...] = ()

    def __bool__(self) -> bool:
        return True


@attrs.frozen
class Unsupported:
    """The provider declines the node; ``reason`` says why in words."""

    reason: str

    def __bool__(self) -> bool:
        return False


KernelMatch = Supported | Unsupported


class Decline(Exception):
    """Raised by :func:`require` / :func:`deny`; carries the decline reason."""

    def __init__(self, fmt: str, args: tuple = ()):
        self.fmt = fmt
        self.args_ = args

    @property
    def reason(self) -> str:
        return self.fmt % self.args_ if self.args_ else self.fmt


def require(cond: Any, fmt: str, *args: Any) -> None:
    """Decline unless ``cond`` holds. ``fmt % args`` is formatted only on decline.

    Raises:
        Decline: when ``cond`` is false.
    """
    if not cond:
        raise Decline(fmt, args)


def deny(fmt: str, *args: Any) -> None:
    """Decline unconditionally with reason ``fmt % args``.

    Raises:
        Decline: always.
    """
    raise Decline(fmt, args)


@attrs.frozen
class CaptureSupport:
    """Whether a kernel can be recorded into a device graph (e.g. a CUDA graph).

    Attributes:
        supported: True when capture is possible.
        reason: why not, when ``supported`` is False (empty otherwise).
    """

    supported: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.supported


def capture_supported() -> CaptureSupport:
    """A :class:`CaptureSupport` saying yes."""
    return CaptureSupport(True)


def capture_unsupported(fmt: str, *args: Any) -> CaptureSupport:
    """A :class:`CaptureSupport` saying no, with reason ``fmt % args``."""
    return CaptureSupport(False, fmt % args if args else fmt)


@attrs.frozen
class WorkspaceRequest:
    """Scratch memory a kernel needs for one input geometry.

    Attributes:
        nbytes: exact size in bytes.
        alignment: byte alignment required.
        lifetime: ``"step"`` (valid during one call) or ``"session"`` (persists).
        role: what it is for, e.g. ``"im2col"``.
    """

    nbytes: int
    alignment: int = 64
    lifetime: str = "step"
    role: str = "workspace"


@attrs.frozen
class KernelSizedOutput:
    """An output whose shape only the kernel knows (NonZero, Unique, Compress,
    NonMaxSuppression...). The executor checks ``dtype``, ``shape`` and the byte
    length of ``data`` before it materialises the output.

    Attributes:
        data: a 1-D owned buffer (bytes or a contiguous numpy array).
        shape: the output shape.
        dtype: the numpy dtype of the elements.
    """

    data: Any
    shape: tuple[int, ...]
    dtype: np.dtype


# ----------------------------------------------------------------- node metadata

@attrs.frozen
class ValueType:
    """Static type of a value as known at plan time.

    Attributes:
        kind: ``"tensor"``, ``"sequence"``, ``"optional"``, ``"map"``, ``"sparse"``
            or ``"unknown"``.
        dtype: ONNX element type (``onnx_ir.DataType`` int) of the tensor or of the
            sequence/optional's tensor elements, or ``None`` when unknown.
        shape: tuple of dims (``int``, ``str`` for a symbolic dim, ``None`` for an
            unknown one), or ``None`` when the rank is unknown.
        elem: for sequence/optional, the element's :class:`ValueType`.
    """

    kind: str = "tensor"
    dtype: int | None = None
    shape: tuple[int | str | None, ...] | None = None
    elem: "ValueType | None" = None

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    @property
    def static_shape(self) -> tuple[int, ...] | None:
        """The shape when every dim is a known int, else ``None``."""
        if self.shape is None or not all(isinstance(d, int) for d in self.shape):
            return None
        return tuple(self.shape)


def estimate_bytes(vt: ValueType | None) -> int:
    """Structural byte estimate of a value: storage size of its dtype (int4 counts
    half a byte) times its elements, symbolic or unknown dims counted as 1, an
    unknown rank as a scalar. Never an invented larger number."""
    if vt is None or vt.dtype is None:
        return 0
    if vt.kind != "tensor":
        return estimate_bytes(vt.elem) if vt.elem is not None else 0
    n = 1
    for d in vt.shape or ():
        if isinstance(d, int) and d >= 0:
            n *= d
    return math.ceil(n * storage_bits(vt.dtype) / 8)


@attrs.define(eq=False)
class NodeSpec:
    """Everything a kernel may know about its node at plan time.

    Attributes:
        name: node name (unique within its graph; made up when the model has none).
        op_type: operator type, e.g. ``"Conv"``.
        domain: ``""`` for ai.onnx, ``"ai.onnx.ml"``, ``"com.microsoft"``, ...
        opset: the version of ``domain`` the model imports.
        attrs: attribute name -> Python value (int, float, str, bytes, lists of
            those, ``np.ndarray`` for tensors, ``onnx_ir.Graph`` for subgraphs).
        inputs: input value names (``""`` for an omitted optional input).
        outputs: output value names (``""`` for an omitted optional output).
        input_types / output_types: one :class:`ValueType` (or ``None``) each.
        constant_inputs: input index -> initializer/constant array known at plan time.
        model: the model's name, for error messages.
        compile_subgraph: callback turning an ``onnx_ir.Graph`` attribute into a
            callable ``fn(*inputs, **outer) -> list`` (control-flow kernels).
        outer_scope: names of outer-scope values the node's subgraphs read; they
            are passed to :meth:`Kernel.run` as keyword ``outer=`` dict.
    """

    name: str
    op_type: str
    domain: str
    opset: int
    attrs: dict[str, Any]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    input_types: tuple[ValueType | None, ...] = ()
    output_types: tuple[ValueType | None, ...] = ()
    constant_inputs: dict[int, np.ndarray] = attrs.Factory(dict)
    model: str = ""
    compile_subgraph: Callable | None = None
    outer_scope: tuple[str, ...] = ()

    def attr(self, name: str, default: Any = None) -> Any:
        """Attribute ``name`` or ``default`` when absent."""
        return self.attrs.get(name, default)

    def input_type(self, i: int) -> ValueType | None:
        return self.input_types[i] if i < len(self.input_types) else None

    def has_input(self, i: int) -> bool:
        """True when optional input ``i`` is present (named, not ``""``)."""
        return i < len(self.inputs) and self.inputs[i] != ""

    @property
    def num_outputs(self) -> int:
        return len(self.outputs)

    def input_bytes(self) -> int:
        return sum(estimate_bytes(t) for t in self.input_types)

    def output_bytes(self) -> int:
        return sum(estimate_bytes(t) for t in self.output_types)


# ------------------------------------------------------------------------ kernels

class Kernel:
    """Base class of a kernel: one instance per node in a compiled plan.

    Subclasses implement :meth:`run` (hot path). Optional hooks: :meth:`check`
    (preconditions via :func:`require`/:func:`deny`), :meth:`estimate_flops`,
    :meth:`prepare` (prepack constant inputs once), :meth:`workspace`,
    :meth:`capture_support`.

    Class attributes:
        multi_output: :meth:`run` returns a tuple (one item per declared output,
            trailing unused ones may be omitted); else it returns one value.
        accepts_strided: inputs may be strided views; False makes the executor
            pass C-contiguous copies.
        view_outputs: outputs are zero-copy views of input 0 (Reshape, Transpose...).
        kernel_sized_outputs: :meth:`run` returns :class:`KernelSizedOutput` items.
        inplace: ``{output index: input index}`` the output may overwrite.
        wants_outer_scope: :meth:`run` takes ``outer=`` (control flow).
        uses_workspace: :meth:`run` takes ``workspace=`` — one uint8 buffer per
            :class:`WorkspaceRequest` that :meth:`workspace` returned for these
            input shapes, exactly that many bytes, aligned; the executor owns
            and reuses them (accounted as ``workspace`` on the provider).
    """

    multi_output: ClassVar[bool] = False
    accepts_strided: ClassVar[bool] = True
    view_outputs: ClassVar[bool] = False
    kernel_sized_outputs: ClassVar[bool] = False
    inplace: ClassVar[Mapping[int, int]] = {}
    wants_outer_scope: ClassVar[bool] = False
    uses_workspace: ClassVar[bool] = False

    def __init__(self, node: NodeSpec):
        self.node = node

    # -- plan-time -------------------------------------------------------------
    @classmethod
    def check(cls, node: NodeSpec) -> None:
        """Raise :class:`Decline` (via :func:`require`/:func:`deny`) when this
        kernel cannot run ``node``. Default: accepts everything."""

    @classmethod
    def estimate_flops(cls, node: NodeSpec) -> float:
        """Estimated floating-point operations (default: one per output element)."""
        out = 0
        for t in node.output_types:
            if t is not None and t.shape is not None:
                n = 1
                for d in t.shape:
                    n *= d if isinstance(d, int) and d > 0 else 1
                out += n
        return float(out)

    @classmethod
    def supports(cls, node: NodeSpec, profile: "DeviceProfile") -> KernelMatch:
        """:class:`Supported` with a cost on ``profile`` or :class:`Unsupported`."""
        try:
            cls.check(node)
        except Decline as d:
            return Unsupported(d.reason)
        cost = Cost.of_work(flops=cls.estimate_flops(node),
                            bytes_moved=node.input_bytes() + node.output_bytes(),
                            gflops=profile.gflops, gbytes_per_s=profile.gbytes_per_s,
                            launch_us=profile.launch_us)
        layouts = () if cls.accepts_strided else ("contiguous",) * len(node.inputs)
        return Supported(cost, layouts)

    def prepare(self, constants: Mapping[int, Any], shared: dict) -> None:
        """Prepack constant inputs once. ``constants`` maps input index to its
        array; ``shared`` is a dict kept per node across every kernel instance of
        it (shape-specialised instances share prepacked state there)."""

    def capture_support(self) -> CaptureSupport:
        """Whether this kernel can be captured into a device graph."""
        if self.kernel_sized_outputs:
            return capture_unsupported("%s has data-dependent output shapes", self.node.op_type)
        return capture_supported()

    def workspace(self, input_shapes: Sequence[tuple[int, ...]]) -> list[WorkspaceRequest]:
        """Exact scratch needs for these input shapes (default none)."""
        return []

    def flops(self, input_shapes: Sequence[tuple[int, ...]]) -> float:
        """Floating-point operations for these runtime input shapes (tracing)."""
        n = 0
        for s in input_shapes[:1]:
            n = int(np.prod(s)) if s is not None else 0
        return float(n)

    def compile(self) -> Callable:
        """The callable the executor calls on the hot path (default :meth:`run`)."""
        return self.run

    # -- run-time --------------------------------------------------------------
    def run(self, *inputs: Any) -> Any:  # pragma: no cover - abstract
        raise TypeError(f"{type(self).__name__} does not define run()")


class FunctionKernel(Kernel):
    """A kernel made from a plain function named like the op, attributes as
    keyword-only arguments with the spec's defaults (see ``cpu_kernel``)."""

    fn: ClassVar[Callable]
    attr_names: ClassVar[tuple[str, ...]]
    pass_node: ClassVar[bool] = False

    def compile(self) -> Callable:
        kwargs = {k: self.node.attrs[k] for k in self.attr_names if k in self.node.attrs}
        if self.pass_node:
            kwargs["node"] = self.node
        fn = type(self).fn
        return partial(fn, **kwargs) if kwargs else fn

    def run(self, *inputs):
        return self.compile()(*inputs)


def function_kernel_class(fn: Callable, *, multi_output: bool = False,
                          check: Callable | None = None,
                          flops: Callable | None = None, **flags: Any) -> type[Kernel]:
    """Build a :class:`FunctionKernel` subclass around ``fn``.

    Keyword-only parameters of ``fn`` are the op's attributes (a parameter named
    ``node`` receives the :class:`NodeSpec`); positional ones are the inputs.
    """
    sig = inspect.signature(fn)
    names = tuple(p.name for p in sig.parameters.values()
                  if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name != "node")
    ns: dict[str, Any] = {
        "fn": staticmethod(fn), "attr_names": names, "multi_output": multi_output,
        "pass_node": "node" in sig.parameters, "__doc__": fn.__doc__,
        "__module__": fn.__module__,
    }
    if check is not None:
        ns["check"] = classmethod(lambda cls, node: check(node))
    if flops is not None:
        ns["estimate_flops"] = classmethod(lambda cls, node: flops(node))
    ns.update(flags)
    cls = type(fn.__name__, (FunctionKernel,), ns)
    cls.fn = fn  # plain function, not bound
    return cls


@attrs.frozen
class DeviceProfile:
    """Throughput figures a provider's cost model uses.

    Attributes:
        gflops: sustained arithmetic (GFLOP/s).
        gbytes_per_s: memory bandwidth (GB/s).
        launch_us: fixed cost per kernel call (µs).
        transfer_gbytes_per_s: host<->device bandwidth (GB/s; ``inf`` when the
            provider shares host memory).
    """

    gflops: float = 20.0
    gbytes_per_s: float = 10.0
    launch_us: float = 0.5
    transfer_gbytes_per_s: float = math.inf
