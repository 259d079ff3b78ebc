"""numba's disk cache for actorrt's compiled kernels, invalidated by a change to
any kernel source file, not only the cached function's own.

numba keys a cached function by the content of the file that defines it. A
stage program cached from one file keeps the machine code of the callees it
inlined or linked from other files after those files change: after a ``git
pull`` into an editable install, or an edit to a callee, the caller would run
the old callee (silently, or with mismatched arguments). :func:`install` puts
locators first in numba's list (``numba.config.CACHE_LOCATOR_CLASSES``, numba's
documented hook) that add :func:`tree_digest` — a SHA-256 over every ``.py``
file under :data:`ROOTS` (``actorrt/providers``) — to the stamp of functions
defined under those roots; then any kernel change recompiles every kernel once.
Functions of other packages fall through to numba's own locators unchanged.
The cache still lives where numba puts it (``NUMBA_CACHE_DIR`` when set, else
``__pycache__`` beside the source, else the user-wide cache folder).

Every module here that compiles with ``cache=True`` imports this module first.
A ``NUMBA_CACHE_LOCATOR_CLASSES`` the user set is left as it is (the user's
locators decide).

Environment variables that change what a kernel compiles to (:data:`SWITCHES`,
e.g. ``ACTORRT_INT8_VNNI=0`` forcing the int8 kernels' AVX2 path on a VNNI
CPU) join the stamp of every function when set (read once, at import): a
cache written under another value is recompiled, not run. Unset, the stamp
is as before.
"""

from __future__ import annotations

import functools
import hashlib
import os

__all__ = ["ROOTS", "SWITCHES", "install", "installed", "tree_digest", "variants"]

#: folders whose ``.py`` files make up the digest (and whose functions get it)
ROOTS: tuple[str, ...] = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))),)

_NUMBA_DEFAULTS = ("UserProvidedCacheLocator", "InTreeCacheLocator", "UserWideCacheLocator",
                   "IPythonCacheLocator", "ZipCacheLocator")
_OURS = ("UserProvidedLocator", "InTreeLocator", "UserWideLocator")


@functools.lru_cache(maxsize=None)
def tree_digest(roots: tuple[str, ...] | None = None) -> str:
    """SHA-256 (hex) over the relative path and bytes of every ``.py`` file
    under ``roots`` (default :data:`ROOTS`), in sorted order; computed once a
    process."""
    h = hashlib.sha256()
    for root in roots or ROOTS:
        files = []
        for d, dirs, names in os.walk(root):
            dirs[:] = sorted(x for x in dirs if x != "__pycache__")
            files += [os.path.join(d, n) for n in names if n.endswith(".py")]
        for f in sorted(files):
            h.update(os.path.relpath(f, root).encode() + b"\0")
            with open(f, "rb") as fh:
                h.update(fh.read())
            h.update(b"\0")
    return h.hexdigest()


#: environment variables read at compile time by kernels under :data:`ROOTS`
SWITCHES: tuple[str, ...] = ("ACTORRT_INT8_VNNI",)
_VARIANTS = tuple((k, os.environ[k]) for k in SWITCHES if k in os.environ)


def variants() -> tuple[tuple[str, str], ...]:
    """The :data:`SWITCHES` set in this process's environment at import, as
    (name, value) pairs (what the stamps hold; empty: stamps as before)."""
    return _VARIANTS


def _ours(py_file: str) -> bool:
    path = os.path.abspath(py_file)
    return any(path.startswith(r + os.sep) for r in ROOTS)


try:
    from numba import config as _config
    from numba.core import caching as _caching

    class _TreeStamp:
        """Mixin: the file's own stamp and the kernel tree's digest."""

        def get_source_stamp(self):
            stamp = (super().get_source_stamp(), tree_digest())
            return stamp + (_VARIANTS,) if _VARIANTS else stamp

        @classmethod
        def from_function(cls, py_func, py_file):
            return super().from_function(py_func, py_file) if _ours(py_file) else None

    class UserProvidedLocator(_TreeStamp, _caching.UserProvidedCacheLocator):
        """``NUMBA_CACHE_DIR`` set: numba's locator, with the tree digest."""

    class InTreeLocator(_TreeStamp, _caching.InTreeCacheLocator):
        """``__pycache__`` beside the source, with the tree digest."""

    class UserWideLocator(_TreeStamp, _caching.UserWideCacheLocator):
        """The user-wide cache folder (read-only installs), with the tree digest."""

    _HAVE_NUMBA = True
except Exception:  # pragma: no cover - numba missing or without these locators
    _HAVE_NUMBA = False


def installed() -> bool:
    """Whether numba's cache locators start with this module's."""
    if not _HAVE_NUMBA:
        return False
    first = (_config.CACHE_LOCATOR_CLASSES or "").split(",")[0].strip()
    return first == f"{__name__}.{_OURS[0]}"


def install() -> bool:
    """Put this module's locators first (idempotent); False (nothing changed)
    without numba or when the user set ``NUMBA_CACHE_LOCATOR_CLASSES``."""
    if not _HAVE_NUMBA:
        return False
    if installed():
        return True
    if _config.CACHE_LOCATOR_CLASSES:
        return False
    _config.CACHE_LOCATOR_CLASSES = ",".join(
        [f"{__name__}.{c}" for c in _OURS] + list(_NUMBA_DEFAULTS))
    return True


install()
