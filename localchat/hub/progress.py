"""Turns byte counts into PullProgress events: speed over a sliding window, ETA, rate-limited."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from localchat.hub.records import PullProgress

ProgressFn = Callable[[PullProgress], None]
WINDOW_S = 3.0  # speed is measured over the last few seconds, so a stall shows quickly
MIN_INTERVAL_S = 0.1  # at most ~10 byte-count events a second; phase changes always go out


class ProgressTracker:
    def __init__(self, name: str, callback: ProgressFn | None, total_bytes: int | None = None) -> None:
        self.name = name
        self.callback = callback
        self.total_bytes = total_bytes
        self.done_bytes = 0
        self.phase = "resolving"
        self.file: str | None = None
        self._samples: deque[tuple[float, int]] = deque()
        self._last_emit = 0.0
        self._transferred = 0  # bytes that came over the network (not resumed ones), for the speed
        # Files of one model may download in parallel: one event at a time reaches the callback.
        self._lock = threading.RLock()

    def set_phase(self, phase: str, *, file: str | None = None, message: str | None = None) -> None:
        with self._lock:
            self.phase = phase
            if file is not None:
                self.file = file
            self.emit(message=message, force=True)

    def add(self, nbytes: int, *, transferred: bool = True) -> None:
        with self._lock:
            self.done_bytes += nbytes
            if transferred:
                self._transferred += nbytes
            self.emit()

    def speed_bps(self) -> float:
        now = time.monotonic()
        self._samples.append((now, self._transferred))
        while len(self._samples) > 2 and now - self._samples[0][0] > WINDOW_S:
            self._samples.popleft()
        t0, b0 = self._samples[0]
        return (self._transferred - b0) / (now - t0) if now > t0 else 0.0

    def event(self, message: str | None = None) -> PullProgress:
        speed = self.speed_bps()
        eta = None
        if self.total_bytes is not None and speed > 0:
            eta = max(self.total_bytes - self.done_bytes, 0) / speed
        return PullProgress(
            self.phase, self.name, self.file, self.done_bytes, self.total_bytes, speed, eta, message
        )

    def emit(self, *, message: str | None = None, force: bool = False) -> None:
        with self._lock:
            now = time.monotonic()
            if self.callback is None or (not force and now - self._last_emit < MIN_INTERVAL_S):
                return
            self._last_emit = now
            self.callback(self.event(message))
