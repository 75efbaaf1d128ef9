"""One desktop app at a time: the first launch holds an OS lock on `<data dir>/desktop.lock` (released
by the OS even if the process dies, so it never goes stale) and publishes its port and a secret in
`desktop-instance.json`; a second launch asks that port to focus the window, then exits."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import IO

log = logging.getLogger(__name__)

LOCK_FILE = "desktop.lock"
INFO_FILE = "desktop-instance.json"
FOCUS_PATH = "/desktop/focus"
TOKEN_HEADER = "x-localchat-instance"


def _try_lock(handle: IO[bytes]) -> bool:
    try:
        if sys.platform == "win32":
            import msvcrt

            msvcrt.locking(handle.fileno(), msvcrt.LK_NBLCK, 1)
        else:
            import fcntl

            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


class InstanceLock:
    def __init__(self, home: Path) -> None:
        self.home = home
        self._handle: IO[bytes] | None = None

    def acquire(self) -> bool:
        """True when this process is the only desktop app for this data dir."""
        self.home.mkdir(parents=True, exist_ok=True)
        handle = open(self.home / LOCK_FILE, "a+b")  # noqa: SIM115 (held open for the process's life)
        if not _try_lock(handle):
            handle.close()
            return False
        self._handle = handle
        return True

    def publish(self, port: int, token: str) -> None:
        """Tell later launches where to knock. Written atomically and readable only by this user."""
        info = self.home / INFO_FILE
        tmp = info.with_name(f".{INFO_FILE}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump({"pid": os.getpid(), "port": port, "token": token}, out)
        os.replace(tmp, info)

    def release(self) -> None:
        if self._handle is None:
            return
        (self.home / INFO_FILE).unlink(missing_ok=True)
        self._handle.close()  # closing drops the OS lock
        self._handle = None


def focus_running(home: Path, wait_s: float = 15.0) -> bool:
    """Ask the running app to bring its window to the front. It may be starting (lock held, port not
    published yet), so keep knocking for a while."""
    import httpx

    deadline = time.monotonic() + wait_s
    while True:
        try:
            info = json.loads((home / INFO_FILE).read_text(encoding="utf-8"))
            response = httpx.post(
                f"http://127.0.0.1:{int(info['port'])}{FOCUS_PATH}",
                headers={TOKEN_HEADER: str(info["token"])},
                timeout=2.0,
            )
            if response.status_code == 204:
                return True
            log.warning("the running localchat answered %d to the focus request", response.status_code)
        except (OSError, ValueError, KeyError, httpx.HTTPError) as exc:
            log.debug("focus request not answered yet: %s", exc)
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.25)
