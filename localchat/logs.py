"""Logging for every mode: stderr as before, plus a rotating file in the data dir, because the desktop
app has no terminal to read (the About dialog shows where the file is)."""

from __future__ import annotations

import contextlib
import logging
import logging.handlers
import os
from pathlib import Path
from typing import Any

from localchat.errors import LocalchatError
from localchat.paths import PRIVATE_FILE, data_dir, home_path, private_dir, private_file, unusable_data_dir

LOG_FILE = "localchat.log"
_MAX_BYTES = 2 * 1024 * 1024  # a few days of normal use; 3 old files kept beside it
_BACKUPS = 3
_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _PrivateRotatingFileHandler(logging.handlers.RotatingFileHandler):
    """Each new file after a rollover is owner-only too (the logs name conversations and models)."""

    def _open(self) -> Any:
        fd = os.open(self.baseFilename, os.O_WRONLY | os.O_CREAT | os.O_APPEND, PRIVATE_FILE)
        return open(fd, self.mode, encoding=self.encoding, errors=self.errors)


def log_path() -> Path:
    return data_dir() / "logs" / LOG_FILE


def setup_logging(level: str, *, to_stderr: bool = True) -> Path | None:
    """Configure the root logger once; returns the log file, or None when it cannot be written
    (a read-only data dir must not stop the app: stderr still works)."""
    root = logging.getLogger()
    root.setLevel(level.upper())
    for handler in list(root.handlers):  # a second call (tests, --selftest) replaces, never duplicates
        root.removeHandler(handler)
        handler.close()
    if to_stderr:
        stream = logging.StreamHandler()
        stream.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        root.addHandler(stream)
    try:
        # The file first, data_dir() after: its check of the dir's modes then says what it tightened in
        # the file too (the desktop app has no terminal).
        home = private_dir(home_path())
        path = private_dir(home / "logs") / LOG_FILE
        private_file(path)
        rotating = _PrivateRotatingFileHandler(
            path, maxBytes=_MAX_BYTES, backupCount=_BACKUPS, encoding="utf-8"
        )
    except OSError as exc:  # the data dir itself may be unusable: the command then says so, not this
        logging.getLogger("localchat").warning("no log file: %s", unusable_data_dir(exc).message)
        return None
    rotating.setFormatter(logging.Formatter(_FORMAT))
    root.addHandler(rotating)
    with contextlib.suppress(OSError, LocalchatError):
        data_dir()
    return path
