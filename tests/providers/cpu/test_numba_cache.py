"""numba's disk cache for the kernels (:mod:`actorrt.providers.cpu._numba_cache`):
a cached caller recompiles when a callee in ANOTHER file changes, in a fresh
process, as after a ``git pull`` into an editable install."""

import os
import subprocess
import sys
import textwrap

import pytest

numba = pytest.importorskip("numba")

from actorrt.providers.cpu import _numba_cache  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))))

DRIVER = textwrap.dedent("""
    import sys
    from actorrt.providers.cpu import _numba_cache as c
    if sys.argv[2] == "ours":
        c.ROOTS = (sys.argv[1],)  # the temporary package is a kernel tree
    sys.path.insert(0, sys.argv[1])
    import kpkg.caller as m
    print(m.g(), sum(m.g.stats.cache_hits.values()))
""")


def _write(pkg, callee_value):
    (pkg / "__init__.py").write_text("")
    (pkg / "callee.py").write_text(
        f"from numba import njit\n\n@njit(cache=True)\ndef f():\n    return {callee_value}\n")
    (pkg / "caller.py").write_text(
        "from numba import njit\nfrom .callee import f\n\n"
        "@njit(cache=True)\ndef g():\n    return f() + 10\n")


def _run(tmp, mode):
    env = {**os.environ, "PYTHONPATH": ROOT}
    env.pop("NUMBA_CACHE_DIR", None)
    env.pop("NUMBA_CACHE_LOCATOR_CLASSES", None)
    p = subprocess.run([sys.executable, "-c", DRIVER, str(tmp), mode], capture_output=True,
                       text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    value, hits = p.stdout.split()
    return int(value), int(hits)


@pytest.mark.parametrize("mode", ["ours", "numba"])
def test_a_changed_callee_file_recompiles_its_cached_caller(tmp_path, mode):
    pkg = tmp_path / "kpkg"
    pkg.mkdir()
    _write(pkg, 1)
    assert _run(tmp_path, mode) == (11, 0)   # compiled, written to the cache
    assert _run(tmp_path, mode) == (11, 1)   # loaded from the cache
    (pkg / "callee.py").write_text(
        "from numba import njit\n\n@njit(cache=True)\ndef f():\n    return 2\n")
    value, _ = _run(tmp_path, mode)
    if mode == "ours":
        assert value == 12  # the tree digest changed: the caller recompiled
    else:
        # numba's own locators key the caller by caller.py alone: the stale
        # machine code this module exists to avoid (if numba ever tracks
        # callees itself, this control fails and the module can go)
        assert value == 11


def test_kernel_modules_install_the_locators_first():
    from actorrt.providers.cpu import _gelu_numba  # noqa: F401  (a kernel module)
    if os.environ.get("NUMBA_CACHE_LOCATOR_CLASSES"):
        pytest.skip("the user's NUMBA_CACHE_LOCATOR_CLASSES is left as it is")
    assert _numba_cache.installed()
    names = numba.config.CACHE_LOCATOR_CLASSES.split(",")
    assert names[:3] == [f"actorrt.providers.cpu._numba_cache.{n}"
                         for n in ("UserProvidedLocator", "InTreeLocator", "UserWideLocator")]
    assert "InTreeCacheLocator" in names  # other packages' functions: numba's own


def test_tree_digest_covers_every_kernel_file(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.py").write_text("y = 2\n")
    d1 = _numba_cache.tree_digest((str(tmp_path),))
    (tmp_path / "sub" / "b.py").write_text("y = 3\n")
    _numba_cache.tree_digest.cache_clear()
    assert _numba_cache.tree_digest((str(tmp_path),)) != d1
