"""Where localchat keeps its state: the platformdirs user data dir, or $LOCALCHAT_HOME when set.

It holds every conversation, so it is private: the directory is created 0700 and the files localchat
writes there 0600 (the database, its WAL and shared-memory files, the logs). A data dir left readable
by other users (an older version, a copy) is tightened the first time a process uses it, once, with a
warning in the log. POSIX modes only: on Windows the user's profile directory is already private."""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import threading
from pathlib import Path

import platformdirs

from localchat.errors import DataDirError

log = logging.getLogger(__name__)

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600
_OTHERS = 0o077  # the group's and everyone else's bits
_checked: set[Path] = set()
_checked_lock = threading.Lock()


def home_path() -> Path:
    """The data dir's path, without creating it."""
    override = os.environ.get("LOCALCHAT_HOME")
    return Path(override).expanduser() if override else Path(platformdirs.user_data_dir("localchat", False))


def data_dir() -> Path:
    path = home_path()
    _make(path)
    _tighten_once(path)
    return path


def models_dir() -> Path:
    """Models localchat fetched itself (not from the Hugging Face cache)."""
    path = data_dir() / "models"
    _make(path)
    return path


def _make(path: Path) -> None:
    try:
        path.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
    except OSError as exc:
        raise unusable_data_dir(exc, path) from None


def private_dir(path: Path) -> Path:
    """`path` created (with its parents) owner-only, like the data dir itself."""
    path.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
    return path


def private_file(path: Path) -> None:
    """Create `path` empty and owner-only if it does not exist; take the others' bits off if it does
    (when it is ours). SQLite gives a database's WAL and shared-memory files the database's own mode."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, PRIVATE_FILE))
        return
    if mode & _OTHERS:
        with contextlib.suppress(OSError):
            path.chmod(mode & ~_OTHERS)


def _tighten_once(root: Path) -> None:
    """Take the group's and others' bits off the data dir and everything in it, once per process."""
    if os.name != "posix":
        return
    with _checked_lock:
        if root in _checked:
            return
        _checked.add(root)
    changed = 0
    for top, _, files in os.walk(root):  # links are not followed: only what lies in the dir itself
        changed += _tighten(top) + sum(_tighten(os.path.join(top, name)) for name in files)
    if changed:
        log.warning(
            "the data directory %s was readable by other users: %d of its entries are owner-only now",
            root,
            changed,
        )


def _tighten(path: str) -> int:
    try:
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode) or not stat.S_IMODE(info.st_mode) & _OTHERS:
            return 0
        os.chmod(path, stat.S_IMODE(info.st_mode) & ~_OTHERS)
    except OSError:  # not ours, or gone meanwhile: leave it (a read-only data dir must not stop anything)
        return 0
    return 1


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
