"""Writes and hashes downloaded chunks on a worker thread, so both overlap the network reads
(file writes and hashlib release the GIL): a pull runs at the link's speed, not at sha256's."""

from __future__ import annotations

import os
import queue
import threading
from typing import Any, BinaryIO

from localchat.errors import DownloadError

FSYNC_EVERY = 64 << 20  # bounds what a power cut can lose; the final hash catches the rest
_STOP = b""


class Sink:
    def __init__(self, out: BinaryIO, hasher: Any, offset: int) -> None:
        self.out = out
        self.hasher = hasher
        self.offset = offset  # bytes on disk, all of them hashed (exact after drain())
        self._queue: queue.Queue[bytes] = queue.Queue(maxsize=64)
        self._error: BaseException | None = None
        self._since_sync = 0
        self._thread = threading.Thread(target=self._run, name="localchat-download-sink", daemon=True)
        self._thread.start()

    def put(self, chunk: bytes) -> None:
        self._raise_write_error()
        if chunk:
            self._queue.put(chunk)

    def drain(self) -> None:
        """Wait until every chunk put so far is written and hashed."""
        self._queue.join()
        self._raise_write_error()

    def _raise_write_error(self) -> None:
        if self._error is not None:
            raise DownloadError(
                f"Cannot write the download to {self.out.name} ({self._error}); the bytes written so far "
                "are kept. Free some disk space (or move HF_HOME) and pull again to resume."
            ) from self._error

    def restart(self, hasher: Any) -> None:
        """Throw away what is on disk (the server sent the file from byte 0)."""
        self.drain()
        self.out.seek(0)
        self.out.truncate(0)
        self.offset, self.hasher = 0, hasher

    def close(self) -> None:
        self._queue.put(_STOP)
        self._thread.join()
        self.out.flush()
        os.fsync(self.out.fileno())

    def _run(self) -> None:
        while True:
            chunk = self._queue.get()
            try:
                if chunk is _STOP:
                    return
                if self._error is None:
                    self._write(chunk)
            except BaseException as exc:  # surfaced to the downloading thread by put()/drain()
                self._error = exc
            finally:
                self._queue.task_done()

    def _write(self, chunk: bytes) -> None:
        self.out.write(chunk)
        self.hasher.update(chunk)
        self.offset += len(chunk)
        self._since_sync += len(chunk)
        if self._since_sync >= FSYNC_EVERY:
            self.out.flush()
            os.fsync(self.out.fileno())
            self._since_sync = 0
