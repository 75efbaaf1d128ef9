"""llama.cpp's own HF -> GGUF converter (convert_hf_to_gguf.py, its conversion/ package and gguf-py),
taken from the llama-cpp-python source distribution on PyPI (it vendors llama.cpp) and cached in the
checkout's .models/. Tests write GGUF files with it so the layout is the one real files have."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest

REQUIREMENT = "llama-cpp-python==0.3.36"
REPO = Path(__file__).resolve().parents[2]
_MEMBERS = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")


def ensure_converter(directory: Path = REPO / ".models") -> Path:
    """The folder holding convert_hf_to_gguf.py; skips the test when no package index answers."""
    target = directory / "llama.cpp-convert"
    if (target / "convert_hf_to_gguf.py").is_file():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "--disable-pip-version-check", "--quiet", "-d", tmp, REQUIREMENT]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        sdists = list(Path(tmp).glob("*.tar.gz"))
        if done.returncode != 0 or not sdists:
            pytest.skip(f"cannot download {REQUIREMENT}: {done.stderr.strip()[-300:]}")
        unpacked = Path(tmp) / "convert"
        with tarfile.open(sdists[0]) as sdist:
            for member in sdist.getmembers():
                _, _, rel = member.name.partition("/vendor/llama.cpp/")
                if rel and rel.startswith(_MEMBERS) and (member.isfile() or member.isdir()):
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
