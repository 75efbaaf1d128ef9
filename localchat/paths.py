"""Where localchat keeps its state: the platformdirs user data dir, or $LOCALCHAT_HOME when set."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

from localchat.errors import DataDirError


def home_path() -> Path:
    """The data dir's path, without creating it."""
    override = os.environ.get("LOCALCHAT_HOME")
    return Path(override).expanduser() if override else Path(platformdirs.user_data_dir("localchat", False))


def data_dir() -> Path:
    path = home_path()
    _make(path)
    return path


def models_dir() -> Path:
    """Models localchat fetched itself (not from the Hugging Face cache)."""
    path = data_dir() / "models"
    _make(path)
    return path


def _make(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise unusable_data_dir(exc, path) from None


def unusable_data_dir(exc: OSError, path: Path | None = None) -> DataDirError:
    """The message for an OSError met while creating or writing something in the data dir."""
    where = exc.filename or path or home_path()
    return DataDirError(
        f"Cannot write to the data directory {home_path()} ({exc.strerror or exc}: {where}). "
        "Choose a writable directory with --home DIR or the LOCALCHAT_HOME environment variable."
    )


def is_in_data_dir(path: str | os.PathLike[str] | None) -> bool:
    if path is None:
        return False
    try:
        return Path(path).expanduser().resolve().is_relative_to(home_path().expanduser().resolve())
    except (OSError, ValueError):
        return False
