"""Control flow: If, Loop and Scan run compiled subgraphs.

Spec: ONNX If (opsets 1-25), Loop (1-25), Scan (8; 9-25). Each body is compiled
once per kernel with ``node.compile_subgraph`` into a
:class:`~actorrt._plan.SubgraphRunner`; values the body reads from enclosing
scopes arrive in ``run(..., outer={name: value})`` and are passed through.
Loop-carried values may be tensors, sequences (lists) or optionals (``None``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._contract import NodeSpec
from .registry import cpu_kernel
from ._control_flow_util import SubgraphKernel, empty_scan_output, stack_scan_output

_VERSIONS = (1, 11, 13, 16, 19, 21, 23, 24, 25)


def _truth(cond: Any, what: str) -> bool:
    """The boolean value of a one-element condition tensor.

    Raises:
        ValueError: ``cond`` does not hold exactly one element.
    """
    c = np.asarray(cond)
    if c.size != 1:
        raise ValueError(f"{what} must hold exactly one element, got shape {c.shape}")
    return bool(c.reshape(-1)[0])


@cpu_kernel("If", since=_VERSIONS)
class If(SubgraphKernel):
    """ONNX If (opsets 1-25): run ``then_branch`` or ``else_branch`` on a scalar
    boolean ``cond``; outputs are the branch's outputs (tensors, sequences or
    optionals)."""

    graphs = ("then_branch", "else_branch")

    def run(self, cond, outer: dict | None = None):
        branch = self.then_branch if _truth(cond, "If condition") else self.else_branch
        return tuple(branch([], outer))


@cpu_kernel("Loop", since=_VERSIONS)
class Loop(SubgraphKernel):
    """ONNX Loop (opsets 1-25): inputs ``(M?, cond?, v_initial...)``, body
    ``(iter_num, cond, v...) -> (cond, v..., scan...)``; outputs the final
    loop-carried values then the scan outputs stacked along a new axis 0
    (``(0, ...)`` from the body's declared output type when no iteration ran)."""

    def __init__(self, node: NodeSpec):
        super().__init__(node)
        self.n_carried = len(self.body.input_names) - 2
        self.n_scan = len(self.body.output_names) - 1 - self.n_carried
        if self.n_carried < 0 or self.n_scan < 0:
            raise ValueError(f"Loop body has {len(self.body.input_names)} inputs and "
                             f"{len(self.body.output_names)} outputs; it needs 2 + N inputs "
                             f"and 1 + N + K outputs")
        self.scan_types = [o.type for o in self.body.plan.outputs[1 + self.n_carried:]]

    def run(self, M, cond, *carried, outer: dict | None = None):
        if len(carried) != self.n_carried:
            raise ValueError(f"Loop got {len(carried)} loop-carried inputs, its body takes "
                             f"{self.n_carried}")
        max_trip = None if M is None else int(np.asarray(M).reshape(-1)[0])
        keep_going = True if cond is None else _truth(cond, "Loop condition")
        values = list(carried)
        scans: list[list[np.ndarray]] = [[] for _ in range(self.n_scan)]
        body = self.body
        n = self.n_carried
        it = 0
        while keep_going and (max_trip is None or it < max_trip):
            outs = body([np.array(it, dtype=np.int64), np.array(keep_going), *values], outer)
            keep_going = _truth(outs[0], "Loop body condition")
            values = list(outs[1:1 + n])
            for k in range(self.n_scan):
                scans[k].append(outs[1 + n + k])
            it += 1
        result = values
        for k, items in enumerate(scans):
            if items:
                result.append(stack_scan_output(items, 0, reverse=False))
            else:
                result.append(empty_scan_output(self.scan_types[k], 0))
        return tuple(result)


def _norm_axis(axis: int, rank: int, what: str) -> int:
    if not -rank <= axis < rank:
        raise ValueError(f"{what} {axis} is out of range for rank {rank}")
    return axis % rank


class _ScanBase(SubgraphKernel):
    """What every Scan version shares: the compiled body and its state / scan
    input / scan output counts."""

    required = ("num_scan_inputs",)

    def __init__(self, node: NodeSpec):
        super().__init__(node)
        self.n_scan_in = int(node.attrs["num_scan_inputs"])
        self.n_state = len(self.body.input_names) - self.n_scan_in
        self.n_scan_out = len(self.body.output_names) - self.n_state


@cpu_kernel("Scan", since=(9, 11, 16, 19, 21, 23, 24, 25))
class Scan(_ScanBase):
    """ONNX Scan (opsets 9-25): inputs ``(state..., scan_input...)``; the body
    runs once per slice along each input's ``scan_input_axes`` (reversed where
    ``scan_input_directions`` is 1); outputs are the final states then the
    per-iteration outputs stacked along ``scan_output_axes`` (reversed where
    ``scan_output_directions`` is 1)."""

    def __init__(self, node: NodeSpec):
        super().__init__(node)
        if self.n_state < 0 or self.n_scan_out < 0:
            raise ValueError("Scan body inputs/outputs disagree with num_scan_inputs")
        a = node.attrs
        self.in_axes = list(a.get("scan_input_axes") or [0] * self.n_scan_in)
        self.in_dirs = list(a.get("scan_input_directions") or [0] * self.n_scan_in)
        self.out_axes = list(a.get("scan_output_axes") or [0] * self.n_scan_out)
        self.out_dirs = list(a.get("scan_output_directions") or [0] * self.n_scan_out)
        self.scan_types = [o.type for o in self.body.plan.outputs[self.n_state:]]

    def run(self, *inputs, outer: dict | None = None):
        n = self.n_state
        states = list(inputs[:n])
        scan_in = inputs[n:]
        if len(scan_in) != self.n_scan_in:
            raise ValueError(f"Scan got {len(scan_in)} scan inputs, expected {self.n_scan_in}")
        moved = []
        length = None
        for x, ax in zip(scan_in, self.in_axes):
            x = np.asarray(x)
            m = np.moveaxis(x, _norm_axis(ax, x.ndim, "scan_input_axes"), 0)
            if length is None:
                length = m.shape[0]
            elif m.shape[0] != length:
                raise ValueError(f"Scan inputs disagree on the sequence length: {length} and "
                                 f"{m.shape[0]}")
            moved.append(m)
        length = length or 0
        outs_per_k: list[list[np.ndarray]] = [[] for _ in range(self.n_scan_out)]
        for t in range(length):
            slices = [m[length - 1 - t] if d == 1 else m[t] for m, d in zip(moved, self.in_dirs)]
            outs = self.body([*states, *slices], outer)
            states = list(outs[:n])
            for k in range(self.n_scan_out):
                outs_per_k[k].append(outs[n + k])
        result = states
        for k, items in enumerate(outs_per_k):
            if items:
                rank = np.ndim(items[0]) + 1
                ax = _norm_axis(self.out_axes[k], rank, "scan_output_axes")
                result.append(stack_scan_output(items, ax, reverse=self.out_dirs[k] == 1))
            else:
                result.append(empty_scan_output(self.scan_types[k], self.out_axes[k]))
        return tuple(result)


@cpu_kernel("Scan", since=8)
class Scan8(_ScanBase):
    """ONNX Scan (opset 8): inputs ``(sequence_lens?, state..., scan_input...)``
    with a leading batch axis; scan inputs are ``(batch, seq, ...)`` and read in
    reverse where ``directions`` is 1; scan outputs are ``(batch, max_seq, ...)``,
    zero-padded past each batch entry's ``sequence_lens``."""

    def __init__(self, node: NodeSpec):
        super().__init__(node)
        self.dirs = list(node.attrs.get("directions") or [0] * self.n_scan_in)
        self.scan_types = [o.type for o in self.body.plan.outputs[self.n_state:]]

    def run(self, sequence_lens, *inputs, outer: dict | None = None):
        n = self.n_state
        states_in = [np.asarray(s) for s in inputs[:n]]
        scan_in = [np.asarray(x) for x in inputs[n:]]
        if len(scan_in) != self.n_scan_in:
            raise ValueError(f"Scan got {len(scan_in)} scan inputs, expected {self.n_scan_in}")
        batch = scan_in[0].shape[0] if scan_in else states_in[0].shape[0]
        max_len = scan_in[0].shape[1]
        lens = (np.full(batch, max_len, np.int64) if sequence_lens is None
                else np.asarray(sequence_lens).reshape(-1).astype(np.int64))
        if lens.shape[0] != batch or (lens < 0).any() or (lens > max_len).any():
            raise ValueError(f"sequence_lens {lens.tolist()} do not fit batch {batch} and "
                             f"sequence length {max_len}")
        final_states: list[list[Any]] = [[] for _ in range(n)]
        per_batch: list[list[np.ndarray]] = []
        for b in range(batch):
            states = [s[b] for s in states_in]
            L = int(lens[b])
            outs_k: list[list[np.ndarray]] = [[] for _ in range(self.n_scan_out)]
            for t in range(L):
                slices = [x[b, L - 1 - t] if d == 1 else x[b, t]
                          for x, d in zip(scan_in, self.dirs)]
                outs = self.body([*states, *slices], outer)
                states = list(outs[:n])
                for k in range(self.n_scan_out):
                    outs_k[k].append(np.asarray(outs[n + k]))
            for i, s in enumerate(states):
                final_states[i].append(np.asarray(s))
            per_batch.append(outs_k)
        result: list[Any] = [np.stack(fs) if fs else np.asarray(s)[:0]
                             for fs, s in zip(final_states, states_in)]
        for k in range(self.n_scan_out):
            proto = next((pb[k][0] for pb in per_batch if pb[k]), None)
            if proto is None:
                empty = empty_scan_output(self.scan_types[k], 0)
                result.append(np.zeros((batch, max_len, *empty.shape[1:]), empty.dtype))
                continue
            out = np.zeros((batch, max_len, *proto.shape), proto.dtype)
            for b, pb in enumerate(per_batch):
                if pb[k]:
                    out[b, :len(pb[k])] = np.stack(pb[k])
            result.append(out)
        return tuple(result)
