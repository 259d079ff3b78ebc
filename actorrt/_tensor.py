"""Device-aware tensors and persistent device IO bindings.

A :class:`Tensor` owns one provider buffer and holds a *capability handle* to
that provider (its actor): copies, syncs and argmax are messages to it. It is
freed exactly once — by :meth:`Tensor.close`, by its context manager, or by the
provider returning every buffer when its session closes.

A :class:`DeviceIoBinding` is a persistent allocation bound to a graph input
(and optionally aliased by a graph output, so a KV-cache style update lands in
the same memory every run), with a physical (capacity) shape and a logical
(valid prefix) shape.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Awaitable, Callable, Sequence

import attrs
import numpy as np
import onnx_ir as ir

from ._dtypes import from_numpy_dtype, storage_bytes, to_numpy_dtype
from ._errors import InvalidArgumentError, OutOfMemoryError, SessionClosedError
from .providers.base import (Adopt, Allocate, Argmax, Buffer, CopyFromHost, CopyToHost,
                             ExecutionProvider, Free, Sync, WriteBytes)

__all__ = ["Tensor", "DeviceIoBinding", "TransferStatistics", "IOBinding", "HostAllocator",
           "host_allocator"]


@attrs.frozen
class TensorLayout:
    """Memory layout of a tensor.

    Attributes:
        strides: element strides per dim (may be negative).
        alignment: byte alignment of the first element.
    """

    strides: tuple[int, ...]
    alignment: int


class Tensor:
    """An owned, device-aware tensor (OrtValue-like).

    Attributes:
        dtype: ONNX element type (``onnx_ir.DataType``).
        shape: dims.
        device: the provider's name (``"cpu"``, ``"cuda"``).
    """

    def __init__(self, provider: ExecutionProvider, buffer: Buffer, dtype: ir.DataType,
                 shape: tuple[int, ...]):
        self._provider = provider
        self._ref = provider.ref
        self._buffer: Buffer | None = buffer
        self.dtype = ir.DataType(int(dtype))
        self.shape = tuple(int(d) for d in shape)
        self._lock = threading.Lock()

    # ------------------------------------------------------------ construct
    # Each constructor works two ways: with a provider (a session's provider
    # actor) it returns an awaitable, ``await Tensor.from_numpy(a, provider)``;
    # without one (or with ``device="cpu"``) it returns the Tensor at once,
    # from plain sync code, on the process-wide CPU allocator
    # (:func:`host_allocator`), as ``onnxruntime.OrtValue.ortvalue_from_numpy``.

    @classmethod
    def from_numpy(cls, array: np.ndarray, provider: ExecutionProvider | str | None = None, *,
                   device: str = "cpu", copy: bool = True,
                   role: str = "tensors") -> "Tensor | Awaitable[Tensor]":
        """A tensor holding ``array``'s values (any shape and dtype).

        With ``copy=False`` on a host-accessible provider a C-contiguous,
        aligned, writeable array is borrowed without a copy (the tensor keeps it
        alive); otherwise the provider copies it in.

        Args:
            array: the values.
            provider: a session's provider: the call returns an awaitable.
                ``None`` (or a device name): the Tensor itself, on the
                process-wide CPU allocator.
            device: ``"cpu"`` (the only device without a provider).

        Raises:
            InvalidArgumentError: a device other than ``"cpu"`` without a provider.
            OutOfMemoryError: over the provider's memory limit.
            SessionClosedError: the provider was closed.
        """
        provider, host = _provider_or_host(provider, device)
        array = np.asarray(array)
        dtype = from_numpy_dtype(array.dtype)
        if (not copy and provider.host_accessible and array.flags.c_contiguous
                and array.flags.aligned and array.flags.writeable):
            msg = Adopt(array, role)
        else:
            msg = CopyFromHost(np.ascontiguousarray(array), role)
        if host is not None:
            return cls._on_host(host, host.call(msg), dtype, array.shape)
        return cls._ask(provider, msg, dtype, array.shape)

    @classmethod
    def ortvalue_from_numpy(cls, array: np.ndarray, device_type: str = "cpu",
                            device_id: int = 0) -> "Tensor":
        """onnxruntime's ``OrtValue.ortvalue_from_numpy``: a CPU tensor over
        ``array`` (borrowed without a copy where it is C-contiguous, aligned
        and writeable, as onnxruntime does).

        Raises:
            InvalidArgumentError: ``device_type`` is not ``"cpu"``.
        """
        return cls.from_numpy(array, device=_device_name(device_type, device_id), copy=False)

    @classmethod
    def from_bytes(cls, data: bytes, dtype: int | ir.DataType, shape: Sequence[int],
                   provider: ExecutionProvider | str | None = None, *,
                   device: str = "cpu") -> "Tensor | Awaitable[Tensor]":
        """A tensor from raw little-endian element bytes (awaitable with a
        provider, the Tensor itself without one: see :meth:`from_numpy`).

        Raises:
            InvalidArgumentError: ``len(data)`` differs from the shape's byte count.
        """
        need = storage_bytes(shape, dtype)
        if len(data) != need:
            raise InvalidArgumentError("raw tensor bytes do not match the shape",
                                       expected=f"{need} bytes for {list(shape)}",
                                       got=f"{len(data)} bytes")
        arr = np.frombuffer(data, dtype=to_numpy_dtype(dtype).newbyteorder("<"))
        return cls.from_numpy(arr.astype(to_numpy_dtype(dtype)).reshape(shape), provider,
                              device=device)

    @classmethod
    def empty(cls, dtype: int | ir.DataType, shape: Sequence[int],
              provider: ExecutionProvider | str | None = None, *, device: str = "cpu",
              role: str = "tensors") -> "Tensor | Awaitable[Tensor]":
        """An uninitialised tensor (awaitable with a provider, the Tensor
        itself without one: see :meth:`from_numpy`).

        Raises:
            OutOfMemoryError: over the limit, or a byte count that overflows —
                checked before anything is allocated.
        """
        provider, host = _provider_or_host(provider, device)
        msg = Allocate(tuple(shape), int(dtype), role)
        if host is not None:
            return cls._on_host(host, host.call(msg), ir.DataType(int(dtype)), tuple(shape))
        return cls._ask(provider, msg, ir.DataType(int(dtype)), tuple(shape))

    @classmethod
    def from_dlpack(cls, obj: Any, provider: ExecutionProvider | str | None = None, *,
                    device: str = "cpu",
                    on_release: Callable[[], None] | None = None) -> "Tensor | Awaitable[Tensor]":
        """Zero-copy import of any DLPack producer on a host-accessible provider
        (awaitable with a provider, the Tensor itself without one: see
        :meth:`from_numpy`). The foreign owner is held by a guard released
        exactly once, after the buffer is returned (``on_release`` runs then).

        Raises:
            InvalidArgumentError: the producer lives on another device.
        """
        provider, host = _provider_or_host(provider, device)
        if not provider.host_accessible:
            array = provider.import_dlpack(obj)
        else:
            try:
                array = np.from_dlpack(obj)
            except (BufferError, RuntimeError, TypeError, AttributeError) as e:
                raise InvalidArgumentError(f"cannot import this DLPack object on provider "
                                           f"{provider.name}: {e}", expected="a CPU DLPack tensor",
                                           got=type(obj).__name__) from e
        holder = [obj, array]

        def guard():
            holder.clear()
            if on_release is not None:
                on_release()

        msg = Adopt(array, "tensors", guard)
        dtype = from_numpy_dtype(array.dtype)
        if host is not None:
            return cls._on_host(host, host.call(msg), dtype, array.shape)
        return cls._ask(provider, msg, dtype, array.shape)

    @classmethod
    async def _ask(cls, provider: ExecutionProvider, msg: Any, dtype: Any,
                   shape: tuple) -> "Tensor":
        buf = await provider.ref.ask(msg)
        return cls(provider, buf, dtype, shape)

    @classmethod
    def _on_host(cls, host: "HostAllocator", buf: Buffer, dtype: Any, shape: tuple) -> "Tensor":
        t = cls(host, buf, dtype, shape)
        # no session closes the process-wide allocator: a dropped tensor's
        # buffer is returned when the tensor is collected (close() earlier)
        weakref.finalize(t, host.free, buf.id)
        return t

    # ------------------------------------------------------------- inspect
    @property
    def device(self) -> str:
        return self._provider.name

    def device_name(self) -> str:
        """onnxruntime's ``OrtValue.device_name()``: ``"cpu"``, ``"cuda"``."""
        return self._provider.name

    def data_type(self) -> str:
        """onnxruntime's ``OrtValue.data_type()``, e.g. ``'tensor(float)'``."""
        from ._dtypes import type_string
        return f"tensor({type_string(int(self.dtype))})"

    def is_tensor(self) -> bool:
        return True

    def has_value(self) -> bool:
        return not self.closed

    @property
    def closed(self) -> bool:
        return self._buffer is None or self._buffer.array is None

    def _array(self) -> Any:
        b = self._buffer
        if b is None or b.array is None:
            raise SessionClosedError("the tensor was closed (or its session ended)")
        return b.array

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        """Packed storage bytes (int4 counts half a byte)."""
        return storage_bytes(self.shape, self.dtype)

    @property
    def layout(self) -> TensorLayout:
        a = self._array()
        item = a.dtype.itemsize or 1
        return TensorLayout(tuple(s // item for s in a.strides),
                            _alignment(self.device_ptr() or 0))

    def device_ptr(self) -> int | None:
        """Address of the first element, or ``None`` for an empty tensor."""
        a = self._array()
        if a.size == 0:
            return None
        if isinstance(a, np.ndarray):
            return int(a.ctypes.data)
        return int(a.data.ptr)

    # -------------------------------------------------------------- export
    def numpy(self) -> np.ndarray:
        """The values as numpy: a zero-copy view on a host-accessible provider.

        Raises:
            InvalidArgumentError: the tensor lives on a device (use ``await
                to_numpy()``).
        """
        if not self._provider.host_accessible:
            raise InvalidArgumentError(f"tensor on {self.device}: use `await tensor.to_numpy()`",
                                       expected="a host tensor", got=self.device)
        return self._array()

    async def to_numpy(self) -> np.ndarray:
        """A host copy, made by the owning provider."""
        self._array()
        return await self._ref.ask(CopyToHost(self._buffer.id))

    def tobytes(self) -> bytes:
        """Raw little-endian element bytes (host tensors)."""
        a = np.ascontiguousarray(self.numpy())
        if a.dtype.byteorder == ">":
            a = a.byteswap().view(a.dtype.newbyteorder("<"))
        return a.tobytes()

    def as_float32(self) -> np.ndarray | None:
        """A typed float32 view, or ``None`` when that would lie (other dtype,
        misaligned or big-endian memory)."""
        return self._typed_view({np.dtype(np.float32)})

    def as_float16(self) -> np.ndarray | None:
        """A typed 16-bit float view (float16 or bfloat16), or ``None``."""
        import ml_dtypes
        return self._typed_view({np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)})

    def _typed_view(self, dtypes: set) -> np.ndarray | None:
        if not self._provider.host_accessible:
            return None
        a = self._array()
        if a.dtype not in dtypes or a.dtype.byteorder == ">" or not a.flags.aligned:
            return None
        return a

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: bool | None = None):
        a = self._array()
        kwargs = {}
        if max_version is not None:
            kwargs["max_version"] = max_version
        if stream is not None:
            kwargs["stream"] = stream
        return a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._array().__dlpack_device__()

    def __array__(self, dtype=None, copy=None):
        a = np.asarray(self.numpy())
        return a.astype(dtype) if dtype is not None else a

    # -------------------------------------------------------------- actions
    async def sync(self) -> None:
        """Wait for all work queued on the owning provider."""
        await self._ref.ask(Sync())

    async def argmax(self, n: int = 0) -> np.ndarray:
        """uint32 argmax over the last axis, computed by the owning provider
        (float32/float16 only; first ``n`` entries when ``n``).

        Raises:
            InvalidArgumentError: another dtype.
        """
        self._array()
        return await self._ref.ask(Argmax(self._buffer.id, n))

    async def clone(self) -> "Tensor":
        """A deep copy on the same provider."""
        host = await self.to_numpy()
        t = Tensor.from_numpy(host, self._provider)
        return t if isinstance(t, Tensor) else await t

    def close(self) -> None:
        """Return the buffer to its provider. Exactly once; later calls and a
        provider already shut down are fine."""
        with self._lock:
            b, self._buffer = self._buffer, None
        if b is None:
            return
        try:
            self._ref.tell(Free(b.id))
        except SessionClosedError:
            self._provider._release(b)  # the provider is gone; release here (idempotent)

    def __enter__(self) -> "Tensor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else self.device
        return f"Tensor({self.dtype.name}, shape={list(self.shape)}, {state})"


def _alignment(ptr: int) -> int:
    if ptr == 0:
        return 0
    return ptr & -ptr if ptr else 0


class HostAllocator:
    """The process-wide CPU allocator: host memory for tensors made without a
    session (``Tensor.from_numpy(array)``), usable from any thread with no
    event loop. It answers the provider messages a :class:`Tensor` sends
    (copies, argmax, frees) in the calling thread, with a CPU provider's
    buffer bookkeeping and memory accounting (no limit).

    Attributes:
        name: ``"cpu"``. host_accessible: ``True``.
        memory: its :class:`~actorrt.providers._memory.MemoryAccountant`
            (role ``tensors``).
    """

    name = "cpu"
    host_accessible = True

    def __init__(self) -> None:
        from .providers.cpu import CPUExecutionProvider

        self._provider = CPUExecutionProvider(workers=1)
        self.memory = self._provider.memory
        self._lock = threading.RLock()
        self.ref = self  # a Tensor's ``ref.ask`` / ``ref.tell`` land in call()

    def call(self, message: Any) -> Any:
        """Handle one provider message now, in the calling thread.

        Raises:
            Whatever the message raises (OutOfMemoryError, InvalidArgumentError...).
        """
        with self._lock:
            handler = self._provider.handle(message)
            try:
                handler.send(None)
            except StopIteration as done:  # the buffer messages never suspend
                return done.value
            handler.close()
            raise InvalidArgumentError(f"{type(message).__name__} needs a session's provider",
                                       expected="a buffer message", got=type(message).__name__)

    async def ask(self, message: Any) -> Any:
        return self.call(message)

    def tell(self, message: Any) -> None:
        self.call(message)

    def free(self, buffer_id: int) -> None:
        """Return a buffer (idempotent)."""
        self.call(Free(buffer_id))

    def _release(self, b: Buffer) -> None:
        with self._lock:
            self._provider._release(b)

    def statistics(self) -> Any:
        """:class:`~actorrt.providers.base.ProviderStatistics` of the allocator."""
        return self._provider.statistics()


_HOST: HostAllocator | None = None
_HOST_LOCK = threading.Lock()


def host_allocator() -> HostAllocator:
    """The process-wide :class:`HostAllocator` (made on first use)."""
    global _HOST
    if _HOST is None:
        with _HOST_LOCK:
            if _HOST is None:
                _HOST = HostAllocator()
    return _HOST


def _device_name(device_type: str, device_id: int = 0) -> str:
    return device_type if not device_id else f"{device_type}:{device_id}"


def _provider_or_host(provider: Any, device: str) -> tuple[Any, HostAllocator | None]:
    """``(provider, None)`` for a provider; ``(host, host)`` for none (or a
    device name given in the provider's place).

    Raises:
        InvalidArgumentError: a device other than the CPU without a provider.
    """
    if isinstance(provider, str):
        provider, device = None, provider
    if isinstance(provider, HostAllocator):
        return provider, provider
    if provider is not None:
        return provider, None
    d = str(device).lower()
    if d not in ("cpu", "cpu:0"):
        raise InvalidArgumentError(
            f"a tensor on device {device!r} needs that device's provider: "
            f"`await Tensor.from_numpy(array, session_provider)`",
            input="device", expected="'cpu' (or a provider)", got=repr(device))
    host = host_allocator()
    return host, host


@attrs.frozen
class TransferStatistics:
    """Host<->device traffic of bindings.

    Attributes:
        upload_calls / upload_bytes: writes into device memory (bytes).
        download_calls / download_bytes: reads back to the host (bytes).
    """

    upload_calls: int
    upload_bytes: int
    download_calls: int
    download_bytes: int


class DeviceIoBinding:
    """A persistent provider allocation bound to a graph input, optionally
    aliased by a graph output (the output is written into the same memory).

    Attributes:
        input_name / output_name: bound graph values.
        physical_shape: capacity dims. logical_shape: the valid prefix now.
        expose_logical_shape: kernels see the logical prefix (fixed at
            allocation) rather than the whole capacity.
    """

    def __init__(self, tensor: Tensor, input_name: str, output_name: str | None,
                 logical_shape: tuple[int, ...], expose_logical_shape: bool, owner: Any):
        self.tensor = tensor
        self.input_name = input_name
        self.output_name = output_name
        self.physical_shape = tensor.shape
        self._logical = tuple(logical_shape)
        self.expose_logical_shape = expose_logical_shape
        self._owner = owner
        self._stats = [0, 0, 0, 0]

    @property
    def logical_shape(self) -> tuple[int, ...]:
        return self._logical

    @property
    def logical_differs(self) -> bool:
        """True while the logical shape is smaller than the capacity (dynamic)."""
        return self._logical != self.physical_shape

    def set_logical_shape(self, shape: Sequence[int]) -> None:
        """Set the valid prefix.

        Raises:
            InvalidArgumentError: rank differs or a dim exceeds the capacity.
        """
        shape = tuple(int(d) for d in shape)
        if len(shape) != len(self.physical_shape) or any(
                d < 0 or d > c for d, c in zip(shape, self.physical_shape)):
            raise InvalidArgumentError(f"logical shape for binding {self.input_name!r} exceeds "
                                       "its capacity", input=self.input_name,
                                       expected=f"within {list(self.physical_shape)}",
                                       got=str(list(shape)))
        self._logical = shape

    def value(self) -> np.ndarray:
        """What kernels see: the logical prefix or the whole buffer."""
        a = self.tensor._array()
        if self.expose_logical_shape:
            return a[tuple(slice(0, d) for d in self._logical)]
        return a

    def store_output(self, value: np.ndarray) -> None:
        """Write a run's output into the bound memory (no-op when a kernel wrote
        it in place)."""
        a = self.tensor._array()
        if value is a or (isinstance(value, np.ndarray) and value.base is a and
                          value.__array_interface__["data"][0] == a.__array_interface__["data"][0]
                          and value.shape == a.shape):
            return
        target = a[tuple(slice(0, d) for d in value.shape)] if value.shape != a.shape else a
        if len(value.shape) != len(a.shape) or any(v > c for v, c in zip(value.shape, a.shape)):
            raise InvalidArgumentError(f"output {self.output_name!r} does not fit its binding",
                                       input=self.output_name,
                                       expected=f"within {list(a.shape)}",
                                       got=str(list(value.shape)))
        np.copyto(target, value)
        self._logical = tuple(value.shape)

    async def write_bytes(self, offset: int, data: bytes) -> None:
        """Upload ``data`` at byte ``offset`` (counted as one upload)."""
        await self.tensor._ref.ask(WriteBytes(self.tensor._buffer.id, offset, bytes(data)))
        self._stats[0] += 1
        self._stats[1] += len(data)

    async def read_bytes(self) -> bytes:
        """Download the logical prefix's bytes (counted as one download)."""
        host = await self.tensor.to_numpy()
        data = np.ascontiguousarray(host[tuple(slice(0, d) for d in self._logical)]).tobytes()
        self._stats[2] += 1
        self._stats[3] += len(data)
        return data

    async def read_bytes_into(self, buf: bytearray | memoryview) -> int:
        """Download into ``buf``; returns the byte count.

        Raises:
            InvalidArgumentError: ``buf`` is too small.
        """
        data = await self.read_bytes()
        mv = memoryview(buf).cast("B")
        if mv.nbytes < len(data):
            raise InvalidArgumentError("buffer too small for the binding's bytes",
                                       expected=f">= {len(data)} bytes", got=f"{mv.nbytes}")
        mv[:len(data)] = data
        return len(data)

    async def device_argmax(self, n: int, result: "DeviceIoBinding") -> None:
        """Argmax over the last axis of these logits (float32/float16), computed
        on the provider that holds them, written as uint32 into ``result``.

        Raises:
            InvalidArgumentError: another dtype, or ``result`` on another
                provider or not uint32.
        """
        if result.tensor._provider is not self.tensor._provider:
            raise InvalidArgumentError("device_argmax result binding lives on another provider",
                                       expected=self.tensor.device, got=result.tensor.device)
        if result.tensor.dtype != ir.DataType.UINT32:
            raise InvalidArgumentError("device_argmax result must be uint32",
                                       expected="tensor(uint32)", got=result.tensor.dtype.name)
        idx = await self.tensor.argmax(n)
        out = result.tensor._array()
        out.reshape(-1)[:idx.size] = idx.reshape(-1)

    def transfer_stats(self) -> TransferStatistics:
        return TransferStatistics(*self._stats)

    def close(self) -> None:
        self.tensor.close()
        self._owner._unbind(self)


class IOBinding:
    """onnxruntime-style IO binding over the same machinery (async run).

    ``bind_input(name, value)`` takes a :class:`Tensor` or a numpy array;
    ``bind_output(name, tensor=None)`` names an output (optionally into a
    preallocated tensor); ``await session.run_with_iobinding(binding)``;
    ``get_outputs()`` returns Tensors; ``copy_outputs_to_cpu()`` numpy arrays.
    """

    def __init__(self, session: Any):
        self._session = session
        self.inputs: dict[str, Any] = {}
        self.outputs: dict[str, Tensor | None] = {}
        self._results: dict[str, Tensor] = {}

    def bind_input(self, name: str, value: Any) -> None:
        self.inputs[name] = value

    def bind_cpu_input(self, name: str, array: np.ndarray) -> None:
        self.inputs[name] = np.asarray(array)

    def bind_output(self, name: str, device: str = "cpu", tensor: Tensor | None = None) -> None:
        self.outputs[name] = tensor

    def clear_binding_inputs(self) -> None:
        self.inputs.clear()

    def clear_binding_outputs(self) -> None:
        self.outputs.clear()

    def get_outputs(self) -> list[Tensor]:
        return [self._results[n] for n in self.outputs]

    def copy_outputs_to_cpu(self) -> list[np.ndarray]:
        return [np.array(self._results[n].numpy(), copy=True) for n in self.outputs]
