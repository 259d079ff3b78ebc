"""Modules imported on first use.

* :func:`lazy_module` — ``_nb = lazy_module("actorrt.providers.cpu.llm._contrib_numba",
  globals(), "_nb")`` stands in for ``from . import _contrib_numba as _nb``:
  the module (and what it imports, numba here) loads when an attribute of
  ``_nb`` is first read, and then replaces the stand-in in the importer's
  namespace, so later reads cost nothing extra.
* :func:`defer_sympy_in_onnx_ir` — onnx-ir imports sympy (~40 % of the
  cost of loading a first model) for symbolic-dimension arithmetic that
  loading and running a model rarely does. While onnx-ir itself is being
  imported (and only then), ``sympy`` and ``onnx_ir._symbolic_shapes`` are
  stand-ins that import the real modules on first use; anyone importing
  sympy afterwards gets the real module as usual.

Used so that ``import actorrt`` is cheap, a model without LLM contrib ops
never imports numba, and a first model loads without sympy.
"""

from __future__ import annotations

import importlib
import sys
import threading
import types
from typing import Any

__all__ = ["lazy_module", "defer_sympy_in_onnx_ir"]

_LOCK = threading.Lock()


class _LazyModule(types.ModuleType):
    """A stand-in that imports the named module on first attribute access."""

    def __init__(self, name: str, namespace: dict | None, alias: str | None,
                 rebind_all: bool = False):
        super().__init__(name)
        object.__setattr__(self, "_lazy_target", (name, namespace, alias, rebind_all))

    def _lazy_load(self) -> types.ModuleType:
        name, namespace, alias, rebind_all = object.__getattribute__(self, "_lazy_target")
        with _LOCK:
            if sys.modules.get(name) is self:
                del sys.modules[name]  # import the real module, not this stand-in
        module = importlib.import_module(name)  # thread-safe: the import lock
        if namespace is not None and namespace.get(alias) is self:
            namespace[alias] = module
        if rebind_all:  # every module holding this stand-in under ``alias``
            for m in list(sys.modules.values()):
                d = getattr(m, "__dict__", None)
                if isinstance(d, dict) and d.get(alias) is self:
                    d[alias] = module
        return module

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._lazy_load(), attr)

    def __setattr__(self, attr: str, value: Any) -> None:
        setattr(self._lazy_load(), attr, value)  # e.g. monkeypatching: reach the module

    def __delattr__(self, attr: str) -> None:
        delattr(self._lazy_load(), attr)

    def __repr__(self) -> str:
        name = object.__getattribute__(self, "_lazy_target")[0]
        return f"<lazy module {name!r}>"


def lazy_module(name: str, namespace: dict | None = None,
                alias: str | None = None) -> types.ModuleType:
    """A stand-in for module ``name`` (absolute) that imports it on first
    attribute access; with ``namespace`` (the importer's ``globals()``) and
    ``alias`` (the name bound there) the real module then replaces it. The
    module itself when it is already imported."""
    if name in sys.modules:
        return sys.modules[name]
    return _LazyModule(name, namespace, alias)


# ------------------------------------------------------------ sympy in onnx-ir

#: module -> the name onnx-ir's modules bind it to
_DEFERRED = {"sympy": "sympy", "onnx_ir._symbolic_shapes": "_symbolic_shapes"}


class _DeferringLoader:
    """Wraps onnx-ir's loader: runs the package's import with the stand-ins."""

    def __init__(self, inner):
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module) -> None:
        stubs = {name: _LazyModule(name, None, alias, rebind_all=True)
                 for name, alias in _DEFERRED.items() if name not in sys.modules}
        sys.modules.update(stubs)
        try:
            self._inner.exec_module(module)
        finally:
            for name, stub in stubs.items():
                if sys.modules.get(name) is stub:
                    del sys.modules[name]
        shapes = stubs.get("onnx_ir._symbolic_shapes")
        if shapes is not None and not hasattr(module, "_symbolic_shapes"):
            module._symbolic_shapes = shapes

    def __getattr__(self, attr: str) -> Any:  # resources, is_package, get_code, ...
        return getattr(self._inner, attr)


class _OnnxIrFinder:
    """A one-shot meta-path finder that wraps onnx-ir's loader."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "onnx_ir":
            return None
        with _LOCK:
            if self in sys.meta_path:
                sys.meta_path.remove(self)
        from importlib.util import find_spec

        try:
            spec = find_spec("onnx_ir")
        except Exception:
            return None  # let the normal machinery report it
        if spec is None or spec.loader is None or "sympy" in sys.modules:
            return spec
        spec.loader = _DeferringLoader(spec.loader)
        return spec


def defer_sympy_in_onnx_ir() -> None:
    """Make the coming import of onnx-ir not import sympy (see the module
    docstring). Nothing happens when onnx-ir or sympy is already imported."""
    if "onnx_ir" in sys.modules or "sympy" in sys.modules:
        return
    with _LOCK:
        if not any(isinstance(f, _OnnxIrFinder) for f in sys.meta_path):
            sys.meta_path.insert(0, _OnnxIrFinder())
