"""The files of one model (split GGUF parts, safetensors shards) download side by side, as
huggingface_hub's snapshot_download does: one slow connection does not hold up the others."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed

from localchat.errors import DownloadCancelledError
from localchat.hub.download import CancelFlag

PARALLEL_FILES = 4


class StopFlag:
    """Set by the user's cancel, or tripped by the first failure so the other downloads stop too."""

    def __init__(self, parent: CancelFlag | None) -> None:
        self._parent = parent
        self._tripped = threading.Event()

    def trip(self) -> None:
        self._tripped.set()

    def is_set(self) -> bool:
        return self._tripped.is_set() or (self._parent is not None and self._parent.is_set())


def run_all(tasks: list[Callable[[CancelFlag | None], None]], cancel: CancelFlag | None) -> None:
    """Run every task (each gets the stop flag); raise the first real failure, else a cancellation."""
    if len(tasks) <= 1:
        for task in tasks:
            task(cancel)
        return
    stop = StopFlag(cancel)
    errors: list[BaseException] = []
    pool = ThreadPoolExecutor(
        max_workers=min(PARALLEL_FILES, len(tasks)), thread_name_prefix="localchat-pull"
    )
    try:
        for future in as_completed([pool.submit(task, stop) for task in tasks]):
            if (exc := future.exception()) is not None:
                errors.append(exc)
                stop.trip()
    except BaseException:  # Ctrl-C while waiting: stop the workers (their partials stay) before leaving
        stop.trip()
        raise
    finally:
        pool.shutdown(wait=True)
    real = [e for e in errors if not isinstance(e, DownloadCancelledError)]
    if real or errors:
        raise (real or errors)[0]
