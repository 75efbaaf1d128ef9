"""Attached pictures as files in the data dir, named by the SHA-256 of their bytes: the same picture is
stored once however often it is attached, a name can never point outside the folder, and a file is
written whole (temporary file, then rename) or not at all."""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path

from localchat.paths import private_dir

_HASH = re.compile(r"[0-9a-f]{64}")
_EXT = re.compile(r"[a-z0-9]{1,5}")


class AttachmentFiles:
    def __init__(self, folder: Path) -> None:
        self.folder = folder  # created on the first save, not at start-up

    def path(self, sha256: str, ext: str) -> Path:
        if not _HASH.fullmatch(sha256) or not _EXT.fullmatch(ext):
            raise ValueError(f"not an attachment name: {sha256}.{ext}")
        return self.folder / f"{sha256}.{ext}"

    def save(self, data: bytes, ext: str) -> str:
        """Store the bytes (once); returns their SHA-256."""
        sha256 = hashlib.sha256(data).hexdigest()
        target = self.path(sha256, ext)
        if target.exists():
            return sha256
        private_dir(self.folder)
        fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".part-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return sha256

    def read(self, sha256: str, ext: str) -> bytes:
        return self.path(sha256, ext).read_bytes()

    def delete(self, sha256: str, ext: str) -> None:
        self.path(sha256, ext).unlink(missing_ok=True)
