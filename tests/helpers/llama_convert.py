"""llama.cpp's own HF -> GGUF converter (convert_hf_to_gguf.py, its conversion/ package and gguf-py),
taken from the llama-cpp-python source distribution on PyPI (it vendors llama.cpp) and cached in the
checkout's .models/. Tests write GGUF files with it so the layout is the one real files have."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

REQUIREMENT = "llama-cpp-python==0.3.36"
REPO = Path(__file__).resolve().parents[2]
_MEMBERS = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")


def ensure_converter(directory: Path = REPO / ".models") -> Path:
    """The folder holding convert_hf_to_gguf.py; skips the test when no package index answers."""

    def keep(member: tarfile.TarInfo, rel: str) -> bool:
        return rel.startswith(_MEMBERS) and (member.isfile() or member.isdir())

    return from_sdist(directory / "llama.cpp-convert", "convert_hf_to_gguf.py", "", keep)


def from_sdist(target: Path, probe: str, prefix: str, keep: Callable[[tarfile.TarInfo, str], bool]) -> Path:
    """`target`, holding the members of the sdist's llama.cpp below `prefix` that `keep` takes (by
    their path below it); downloaded and unpacked once (`probe` is a file that shows it was), and the
    test skipped when no package index answers."""
    if (target / probe).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "--disable-pip-version-check", "--quiet", "-d", tmp, REQUIREMENT]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        sdists = list(Path(tmp).glob("*.tar.gz"))
        if done.returncode != 0 or not sdists:
            pytest.skip(f"cannot download {REQUIREMENT}: {done.stderr.strip()[-300:]}")
        unpacked = Path(tmp) / "unpacked"
        with tarfile.open(sdists[0]) as sdist:
            for member in sdist.getmembers():
                _, _, rel = member.name.partition(f"/vendor/llama.cpp/{prefix}")
                if rel and keep(member, rel):
                    member.name = rel
                    sdist.extract(member, unpacked, filter="data")
        if not target.exists():
            os.replace(unpacked, target)  # atomic: a half-extracted folder is never seen
    return target


def convert(folder: Path, out: Path, outtype: str = "f32") -> Path:
    """Run llama.cpp's converter on a transformers folder."""
    script = ensure_converter() / "convert_hf_to_gguf.py"
    cmd = [sys.executable, str(script), str(folder), "--outfile", str(out), "--outtype", outtype]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return out
