"""What the CPU provider's fusions share (:mod:`._fusion`, :mod:`._prologue`):
the producer/consumer view of a plan's steps they match patterns on, the
names and types a fused step's node takes from the nodes it replaces, and
running the original kernels when a value leaves a fused fast path."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ...._errors import ActorRTError, KernelError
from ..._contract import NodeSpec

__all__ = ["StepGraph", "slot_names", "run_original", "replace_groups"]


class StepGraph:
    """Producer/consumer maps over a plan's steps (by slot); ``protected``:
    slots read outside the steps (graph outputs)."""

    def __init__(self, steps: Sequence[Any], protected: set[int]):
        self.producer: dict[int, Any] = {}
        self.consumers: dict[int, list] = {}
        self.protected = protected
        for st in steps:
            for o in st.outputs:
                if o >= 0:
                    self.producer[o] = st
            for i in list(st.inputs) + [sl for _, sl in st.outer]:
                if i >= 0:
                    self.consumers.setdefault(i, []).append(st)

    def only_reader(self, slot: int) -> Any:
        """The single step reading ``slot`` (once), when ``slot`` is no graph output."""
        readers = self.consumers.get(slot, [])
        if slot in self.protected or len(readers) != 1:
            return None
        st = readers[0]
        return st if list(st.inputs).count(slot) == 1 else None

    def unused(self, slot: int) -> bool:
        return slot < 0 or (slot not in self.protected and not self.consumers.get(slot))

    def read_early(self, members: Sequence[Any], outputs: Sequence[int],
                   pos: dict[int, int]) -> bool:
        """Whether a step outside ``members`` reads one of ``outputs`` before
        the last member runs (``pos``: step id -> position), so the fused step,
        run where the last member ran, would come too late for it."""
        end = max(pos[id(s)] for s in members)
        return any(pos[id(r)] < end and r not in members
                   for o in outputs if o >= 0 for r in self.consumers.get(o, []))


def positions(steps: Sequence[Any]) -> dict[int, int]:
    """step id -> position in ``steps`` (steps a fusion made are not numbered yet)."""
    return {id(st): i for i, st in enumerate(steps)}


def replace_groups(steps: Sequence[Any], groups: Sequence[tuple[Sequence[Any], Any]],
                   build: Callable[[Any], Any]) -> tuple[list, list[tuple[str, tuple]]]:
    """``steps`` with each group's members (disjoint) replaced by
    ``build(payload)``, placed where the group's last member ran; and per
    group ``(fused node name, member node names in order)``."""
    if not groups:
        return list(steps), []
    pos = positions(steps)
    member: dict[int, int] = {}
    for gi, (members, _) in enumerate(groups):
        for st in members:
            member[id(st)] = gi
    last = [max(members, key=lambda st: pos[id(st)]) for members, _ in groups]
    out: list = []
    fusions: list[tuple[str, tuple]] = []
    for st in steps:
        gi = member.get(id(st))
        if gi is None:
            out.append(st)
        elif last[gi] is st:
            members, payload = groups[gi]
            out.append(build(payload))
            names = tuple(m.node.name for m in sorted(members, key=lambda m: pos[id(m)]))
            fusions.append((out[-1].node.name, names))
    return out, fusions


def slot_names(steps: Sequence[Any]) -> tuple[dict[int, str], dict[int, Any]]:
    """slot -> value name and slot -> value type over the inputs and outputs
    of ``steps`` (what a fused step's node is declared with)."""
    names: dict[int, str] = {}
    types: dict[int, Any] = {}
    for st in steps:
        names.update(zip(st.inputs, st.node.inputs))
        names.update(zip(st.outputs, st.node.outputs))
        types.update(zip(st.inputs, st.node.input_types))
        types.update(zip(st.outputs, st.node.output_types))
    return names, types


def run_original(fused: NodeSpec, sub_steps: Sequence[Any], consts: dict[int, Any],
                 in_slots: Sequence[int], out_slots: Sequence[int], inputs: Sequence[Any]
                 ) -> tuple:
    """Run a fused step's original kernels one after another (their compiled
    callables) on ``inputs`` (one per ``in_slots``); the values of
    ``out_slots``. Errors name the original node."""
    env: dict[int, Any] = {s: v for s, v in zip(in_slots, inputs) if s >= 0}
    for st in sub_steps:
        args = [None if i < 0 else (env[i] if i in env else consts[i]) for i in st.inputs]
        try:
            r = st.fn(*args)
        except ActorRTError as e:
            if e.node is None:
                e.node = st.node.name
            raise
        except MemoryError:
            raise
        except Exception as e:
            raise KernelError(f"{st.node.op_type} kernel (fused into {fused.name}) failed: "
                              f"{type(e).__name__}: {e}", op_type=st.node.op_type,
                              model=st.node.model, node=st.node.name) from e
        outs = r if st.kernel.multi_output else (r,)
        for slot, v in zip(st.outputs, outs):
            if slot >= 0:
                env[slot] = v
    return tuple(env.get(s) for s in out_slots)
