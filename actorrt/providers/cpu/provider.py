"""The CPU execution provider: host memory, numpy kernels."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .._contract import DeviceProfile
from ..base import ExecutionProvider
from .registry import CPU_KERNELS

__all__ = ["CPUExecutionProvider"]

#: Rough figures for a small x86 server core pair; they only rank choices.
CPU_PROFILE = DeviceProfile(gflops=40.0, gbytes_per_s=10.0, launch_us=0.3)


_MASK_OPS = {("", op) for op in ("ReduceSum", "Sub", "Cast", "Shape", "Gather")}


def _may_fuse(steps) -> bool:
    """Whether :meth:`CPUExecutionProvider.fuse_steps`' patterns can match
    ``steps`` (a necessary condition, checked without importing them: their
    modules import numba, which a model they cannot fuse never needs).
    Decoder blocks (and stacks of them) start at a com.microsoft
    GroupQueryAttention; the decode prologue (:mod:`._prologue`) is the
    attention-mask lengths (ReduceSum, Sub, Cast, Shape, Gather) or a Gather
    of a constant 3-D int8/uint8 block table. Keep this in step with them."""
    ops = {(st.node.domain or "", st.node.op_type) for st in steps}
    if ("com.microsoft", "GroupQueryAttention") in ops or _MASK_OPS <= ops:
        return True
    for st in steps:
        if st.node.op_type == "Gather" and not st.node.domain:
            table = st.node.constant_inputs.get(0)
            if isinstance(table, np.ndarray) and table.ndim == 3 and table.dtype in (
                    np.uint8, np.int8):
                return True
    return False


class CPUExecutionProvider(ExecutionProvider):
    """Runs kernels with numpy on host memory. Buffers are numpy arrays, so
    tensors on this provider export to numpy and DLPack without a copy.

    Args:
        workers: worker actors (segments that may run at once).
        memory_limit: bytes this provider may hold at once (``None``: no limit).
        threads: threads each kernel may use (BLAS and compiled kernels;
            ``None``: leave the pools as they are, every core by default).
    """

    name = "cpu"
    aliases = ("CPUExecutionProvider", "CPU")
    host_accessible = True
    registry = CPU_KERNELS

    def __init__(self, *, workers: int | None = None, memory_limit: int | None = None,
                 threads: int | None = None):
        super().__init__(workers=workers or min(4, os.cpu_count() or 1),
                         memory_limit=memory_limit, profile=CPU_PROFILE)
        if threads is not None and int(threads) < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.threads = None if threads is None else int(threads)

    def segment_context(self):
        """Applies :attr:`threads` (:mod:`._threads`) on the running worker."""
        if self.threads is not None:
            from . import _threads
            _threads.apply(self.threads)
        return super().segment_context()

    def fuse_steps(self, steps, protected, consts, make_step):
        """Fuse LLM decoder blocks (:mod:`.llm._fusion`) among this provider's
        steps, then runs of consecutive int8 blocks into stacks (with the LM
        head that follows them), and the graph's input prologue (:mod:`.llm._prologue`: attention-mask lengths,
        block-quantized embedding)."""
        #: (attention node, reason) of each decoder block the last plan left unfused
        self.fusion_declines: list[tuple[str, str]] = []
        mine = [st for st in steps if st.provider is self]
        if len(mine) < 8 or not _may_fuse(mine):
            return steps, []
        from .llm import _fusion, _prologue  # they import numba: only for graphs they may fuse
        steps, fusions = _fusion.fuse_decoder_blocks(steps, protected, consts, make_step, self,
                                                     self.fusion_declines)
        if _prologue.FUSE_PROLOGUE:
            steps, prologue = _prologue.fuse_prologue(steps, protected, consts, make_step, self)
            fusions = fusions + prologue
        if _fusion.STACK_BLOCKS:
            steps, stacks = _fusion.fuse_decoder_stacks(steps, protected, make_step, consts)
            fusions = fusions + stacks
        return steps, fusions

    def alloc_array(self, shape, dtype, zero):
        return np.zeros(shape, dtype) if zero else np.empty(shape, dtype)

    def to_host(self, array: Any) -> np.ndarray:
        return np.array(array, copy=True)

    def from_host(self, array: np.ndarray) -> np.ndarray:
        return np.array(array, copy=True)

    def write_bytes(self, array, offset, data):
        view = array.reshape(-1).view(np.uint8)
        if offset < 0 or offset + len(data) > view.nbytes:
            raise ValueError(f"write of {len(data)} bytes at offset {offset} exceeds the "
                             f"buffer's {view.nbytes} bytes")
        view[offset:offset + len(data)] = np.frombuffer(data, np.uint8)

    def argmax(self, array, n):
        a = array if not n else array[..., :n]
        return np.argmax(a, axis=-1).astype(np.uint32)
