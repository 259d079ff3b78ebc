"""Owned outputs: what a run hands back never aliases memory someone else holds.

Kernels are free to return views (``Identity``, ``Reshape``, ``Transpose``,
``Slice``, ``Split``... of their input) and constants as they are: inside a
plan that is zero-copy. At the boundary, though, a returned array that shares
memory with a caller's feed, with a constant of the plan (an initializer, a
folded value), or with another returned output would let a write to one corrupt
the other (``out -= mean`` changing the caller's input, or the next run's
output). :func:`own_outputs` copies exactly those outputs, plus any read-only
one; fresh arrays pass through untouched.

The check is cheap: each array's *root* (the object at the end of its
``.base`` chain) is compared by identity with the roots of the feeds and the
constants (collected once per plan); only outputs that share a root with
another output are compared by their memory (``np.shares_memory``).

Memory the caller *donated* to the run (``donate=``, a bound KV cache) is
meant to be written in place and returned: outputs on a donated feed's root
are left as they are.
"""

from __future__ import annotations

import weakref
from typing import Any, Iterable

import numpy as np

__all__ = ["own_outputs", "root_of", "constant_roots"]

_ndarray = np.ndarray


def root_of(a: Any) -> Any:
    """The object that owns ``a``'s memory: the end of its ``.base`` chain
    (through ``memoryview.obj`` too). ``a`` itself when it owns its data."""
    while True:
        b = getattr(a, "base", None)
        if b is None:
            if isinstance(a, memoryview) and a.obj is not None:
                a = a.obj
                continue
            return a
        a = b


_CONSTANT_ROOTS: "weakref.WeakKeyDictionary[Any, dict[int, Any]]" = weakref.WeakKeyDictionary()


def _plan_constants(plan: Any, seen: set[int]) -> Iterable[Any]:
    if id(plan) in seen:
        return
    seen.add(id(plan))
    yield from plan.output_consts.values()
    for spec in plan.inputs:
        if spec.has_default:
            yield spec.default
    for st in plan.steps:
        yield from st.node.constant_inputs.values()
        kernel = st.kernel
        attrs = getattr(kernel, "__dict__", None) or {}
        for v in attrs.values():
            for sub in (v.values() if isinstance(v, dict) else
                        v if isinstance(v, (list, tuple)) else (v,)):
                inner = getattr(sub, "plan", None)
                if inner is not None and hasattr(inner, "output_consts") and \
                        hasattr(inner, "steps"):
                    yield from _plan_constants(inner, seen)


def constant_roots(plan: Any) -> dict[int, Any]:
    """``id(root) -> root`` of every constant array ``plan`` (and the plans of
    its control-flow bodies) holds: initializers, folded values, defaults of
    overridable inputs. Computed once per plan."""
    roots = _CONSTANT_ROOTS.get(plan)
    if roots is None:
        roots = {}
        stack = list(_plan_constants(plan, set()))
        while stack:
            v = stack.pop()
            if isinstance(v, _ndarray):
                r = root_of(v)
                roots[id(r)] = r
            elif isinstance(v, (list, tuple)):
                stack.extend(v)
        _CONSTANT_ROOTS[plan] = roots
    return roots


def _root_id(a: Any) -> int:
    # numpy collapses view chains: ``base`` is the owning array or a foreign
    # buffer object (mmap, bytes), so this loop runs at most a few times
    b = a.base
    while b is not None:
        a = b
        b = getattr(a, "base", None)
    if type(a) is memoryview and a.obj is not None:
        return id(root_of(a.obj))
    return id(a)


def own_outputs(outputs: list, feeds: dict, plan: Any,
                donated: frozenset | set = frozenset()) -> list:
    """``outputs`` with every array that shares memory with a feed (not
    donated), a constant of ``plan``, or another output replaced by a copy;
    read-only arrays are copied too (a copy is writable). Sequence outputs are
    rebuilt when they are a fed list or hold such an array. Arrays that own
    fresh memory are returned as they are (no copy).

    Args:
        outputs: a run's outputs (numpy arrays, lists of them, ``None``).
        feeds: the caller's feeds (input name -> value) of that run.
        plan: the run's plan (its constants are looked up once and cached).
        donated: names of feeds the caller donated (outputs may alias them).

    Returns:
        A new list when something was copied, else ``outputs`` itself.
    """
    ndarray = _ndarray
    fed: dict[int, bool] = {}  # root id of a feed -> donated
    lists: set[int] = set()
    for name, v in feeds.items():
        if type(v) is ndarray or isinstance(v, ndarray):
            r = _root_id(v)
            fed[r] = fed.get(r, False) or name in donated
        elif isinstance(v, list):
            lists.add(id(v))
            d = name in donated
            for x in v:
                if isinstance(x, ndarray):
                    r = _root_id(x)
                    fed[r] = fed.get(r, False) or d
    consts = _CONSTANT_ROOTS.get(plan)
    if consts is None:
        consts = constant_roots(plan)
    seen: dict[int, Any] = {}  # root id -> the array (or list of arrays) returned on it
    result = None
    for i, v in enumerate(outputs):
        if type(v) is ndarray and v.base is None:
            # an array owning its memory (the usual fresh kernel output)
            r = id(v)
            if r not in fed and r not in consts and r not in seen:
                seen[r] = v
                continue
            w = _own_array(v, fed, consts, seen)
        elif isinstance(v, ndarray):
            w = _own_array(v, fed, consts, seen)
        elif isinstance(v, list):
            w = _own_list(v, fed, consts, seen, lists)
        else:
            continue
        if w is not v:
            if result is None:
                result = list(outputs)
            result[i] = w
    return outputs if result is None else result


def _own_list(v: list, fed, consts, seen, fed_lists) -> list:
    out = None
    for j, x in enumerate(v):
        if isinstance(x, _ndarray):
            y = _own_array(x, fed, consts, seen)
            if y is not x:
                if out is None:
                    out = list(v)
                out[j] = y
    if out is None and id(v) in fed_lists:
        out = list(v)
    return v if out is None else out


def _own_array(a: np.ndarray, fed, consts, seen) -> np.ndarray:
    r = _root_id(a)
    donated = fed.get(r)
    if donated:
        return a  # donated memory: written in place on purpose
    if donated is not None or r in consts or not a.flags.writeable:
        return np.array(a, copy=True)
    prev = seen.get(r)
    if prev is None:
        seen[r] = a
        return a
    if type(prev) is not list:
        prev = seen[r] = [prev]
    for p in prev:
        if p is a or _overlap(p, a):
            return np.array(a, copy=True)  # a copy owns its memory: not recorded
    prev.append(a)
    return a


def _overlap(a: np.ndarray, b: np.ndarray) -> bool:
    if not a.size or not b.size:
        return False
    try:
        return bool(np.shares_memory(a, b, max_work=100_000))
    except np.exceptions.TooHardError:  # pragma: no cover - pathological strides
        return True
