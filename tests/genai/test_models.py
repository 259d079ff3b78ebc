"""The model cache (:mod:`actorrt.genai.models`): a built folder serves
offline, an unusable ``ACTORRT_HOME`` is a typed error, and the files written
into the cache share the folder's permissions. Each test works on a temporary
home holding a copy of the built SmolLM2 folder's small files; nothing is
downloaded and the model never runs."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess

import pytest

import actorrt
from actorrt.genai import models
from actorrt.genai.models import KNOWN_MODELS, model_file, prepare_model


@pytest.fixture(scope="module")
def built():
    try:
        return prepare_model("smollm2", progress=False)
    except actorrt.ModelLoadError as exc:  # offline machine without the cache
        pytest.skip(f"SmolLM2 unavailable: {exc}")


def _copy_folder(src, dest):
    """The built folder's small files; its weight file is a stand-in (these
    tests never run the model). No hard link to the real one: the ONNX
    loader refuses a data file with several links."""
    dest.mkdir(parents=True)
    for name in ("genai_config.json", "model.onnx", "tokenizer.json"):
        shutil.copy2(src / name, dest / name)
    (dest / "model.onnx.data").write_bytes(b"stand-in")
    return dest


@pytest.fixture
def home(tmp_path, built, monkeypatch):
    """A temporary ACTORRT_HOME with the built folder and no downloads."""
    root = tmp_path / "home"
    _copy_folder(built, root / "models" / KNOWN_MODELS["smollm2"].folder)
    monkeypatch.setenv("ACTORRT_HOME", str(root))

    def no_network(*args, **kwargs):
        raise AssertionError(f"tried to run {args[0] if args else kwargs}")

    monkeypatch.setattr(subprocess, "run", no_network)
    return root


def test_a_built_folder_serves_offline_without_its_gguf(home):
    assert not (home / "downloads").exists()
    folder = prepare_model("smollm2", progress=False)
    assert folder == home / "models" / KNOWN_MODELS["smollm2"].folder
    assert prepare_model("SmolLM2", home=home, progress=False) == folder


def test_a_folder_from_another_gguf_is_not_taken_for_the_known_model(home):
    """Only a folder built from the pinned GGUF serves offline; another one
    under the same name needs the GGUF (here: a download, refused)."""
    import json

    cfg_path = home / "models" / KNOWN_MODELS["smollm2"].folder / "genai_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["source"]["gguf_sha256"] = "0" * 64
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(AssertionError, match="tried to run"):
        prepare_model("smollm2", progress=False)


@pytest.mark.parametrize("kind", ["a file", "under a file", "empty"])
def test_an_unusable_home_is_a_model_load_error(tmp_path, monkeypatch, kind):
    blocker = tmp_path / "blocker"
    blocker.write_text("not a folder")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: (_ for _ in ()).throw(
        AssertionError("no download expected")))
    if kind == "empty":  # set but empty: the default cache, not the current folder
        monkeypatch.setenv("ACTORRT_HOME", "")
        assert models.model_home() != models.Path("")
        return
    home = blocker if kind == "a file" else blocker / "sub"
    monkeypatch.setenv("ACTORRT_HOME", str(home))
    with pytest.raises(actorrt.ModelLoadError, match="cannot use the model cache") as info:
        prepare_model("smollm2", progress=False)
    assert str(home) in str(info.value)
    assert not isinstance(info.value, (FileNotFoundError, NotADirectoryError))


def test_files_written_into_the_cache_share_its_permissions(home):
    folder = home / "models" / KNOWN_MODELS["smollm2"].folder
    (folder / "model.onnx").chmod(0o644)
    for level, last in ((0, True), (4, False), (4, True)):
        path = model_file(folder, level, last_logits=last)
        assert path.parent == folder and path.name != "model.onnx"
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path
    assert not list(folder.glob("*.part"))
    # one left 0600 by an older version is repaired when it is next used
    path = model_file(folder, 0, last_logits=True)
    path.chmod(0o600)
    assert stat.S_IMODE(model_file(folder, 0, last_logits=True).stat().st_mode) == 0o644
