"""Downloads the server runs for the UI and the management API: one background thread per model
(`hub.pull`), progress kept as the latest `PullProgress` dict and pushed to any number of watchers.

A pull belongs to the server, not to the client that asked for it: a client that leaves does not stop
it, a second client can watch it, and only `cancel` stops it (the partial file stays, so a later pull
resumes from it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

FINAL_PHASES = ("done", "error", "cancelled")
NOTIFY_INTERVAL_S = 0.1  # progress callbacks can come per chunk; watchers need ~10 updates a second


@dataclass(slots=True)
class PullJob:
    name: str
    cancel_event: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    progress: dict[str, Any] = field(default_factory=dict)
    result: Any = None  # the hub's LocalModel once done
    error: str | None = None
    echo: Callable[[Any], None] | None = None  # also gets each raw PullProgress (the terminal's bar)
    started_at: float = field(default_factory=time.time)
    _watchers: list[tuple[asyncio.AbstractEventLoop, asyncio.Queue[dict[str, Any]]]] = field(
        default_factory=list
    )
    _notified_at: float = 0.0

    @property
    def finished(self) -> bool:
        return self.done.is_set()

    @property
    def percent(self) -> int | None:
        total = self.progress.get("total_bytes") or 0
        return int(100 * (self.progress.get("done_bytes") or 0) / total) if total else None

    def update(self, progress: dict[str, Any], *, force: bool = False) -> None:
        """Called on the pull's thread: keep the latest state, wake watchers (throttled)."""
        phase_changed = progress.get("phase") != self.progress.get("phase")
        self.progress = progress
        now = time.monotonic()
        if not (force or phase_changed or now - self._notified_at >= NOTIFY_INTERVAL_S):
            return
        self._notified_at = now
        for loop, queue in list(self._watchers):
            with contextlib.suppress(RuntimeError):  # that watcher's loop is closed: it left
                loop.call_soon_threadsafe(queue.put_nowait, progress)

    async def watch(self) -> AsyncGenerator[dict[str, Any], None]:
        """The current state, then every update, ending with the final one (done, error, cancelled)."""
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        entry = (asyncio.get_running_loop(), queue)
        self._watchers.append(entry)
        try:
            current = dict(self.progress)
            yield current
            if current.get("phase") in FINAL_PHASES:
                return
            while True:
                try:
                    progress = await asyncio.wait_for(queue.get(), timeout=1.0)
                except TimeoutError:
                    progress = dict(self.progress)  # catch a final state whose wake-up was lost
                    if progress.get("phase") not in FINAL_PHASES:
                        continue
                yield progress
                if progress.get("phase") in FINAL_PHASES:
                    return
        finally:
            self._watchers.remove(entry)


class Pulls:
    """The pulls of this server, by name. `on_done(job)` runs on the pull's thread when it succeeds."""

    def __init__(self, data_dir: Path | None = None, on_done: Callable[[PullJob], None] | None = None):
        self.data_dir = data_dir
        self.on_done = on_done
        self._jobs: dict[str, PullJob] = {}
        self._lock = threading.Lock()

    def start(self, name: str, echo: Callable[[Any], None] | None = None) -> PullJob:
        """Start pulling `name`, or return the pull of it already running."""
        with self._lock:
            job = self._jobs.get(name)
            if job is not None and not job.finished:
                return job
            job = PullJob(name, echo=echo)
            job.progress = pull_progress(name, "resolving", "Looking the model up…")
            self._jobs[name] = job
        threading.Thread(target=self._run, args=(job,), name=f"pull-{name}", daemon=True).start()
        return job

    def get(self, name: str) -> PullJob | None:
        with self._lock:
            return self._jobs.get(name)

    def jobs(self) -> list[PullJob]:
        with self._lock:
            return list(self._jobs.values())

    def cancel(self, name: str) -> bool:
        job = self.get(name)
        if job is None or job.finished:
            return False
        job.cancel_event.set()
        return True

    def cancel_all(self) -> None:
        for job in self.jobs():
            job.cancel_event.set()

    def _run(self, job: PullJob) -> None:
        from localchat import hub

        def progress(p: Any) -> None:
            job.update(p.to_dict())
            if job.echo is not None:
                job.echo(p)

        try:
            job.result = hub.pull(
                job.name, progress=progress, cancel=job.cancel_event, data_dir=self.data_dir
            )
        except Exception as exc:  # a pull must end in a final state whatever happened
            if job.cancel_event.is_set():
                final = pull_progress(job.name, "cancelled", cancelled_message(job.progress), job.progress)
            else:
                job.error = getattr(exc, "message", None) or str(exc) or type(exc).__name__
                # With an echo (the CLI's progress bar) the caller reports the failure: say it once.
                (log.debug if job.echo is not None else log.warning)(
                    "pull of %s failed: %s", job.name, job.error
                )
                final = pull_progress(job.name, "error", job.error, job.progress)
            job.update(final, force=True)
            job.done.set()
            return
        try:  # models.yaml `eagle:`: the head comes along, quietly (watchers follow the model's progress)
            hub.pull_eagle_head(job.name, cancel=job.cancel_event, data_dir=self.data_dir)
        except Exception as exc:  # the model is here; --speculative eagle pulls the head again at start
            log.warning("pull of %s: its EAGLE-3 head failed: %s", job.name, getattr(exc, "message", exc))
        if job.progress.get("phase") != "done":
            job.update(pull_progress(job.name, "done", "Downloaded.", job.progress), force=True)
        job.done.set()
        if self.on_done is not None:
            try:
                self.on_done(job)
            except Exception:
                log.exception("after the pull of %s", job.name)


def pull_progress(name: str, phase: str, message: str, last: dict[str, Any] | None = None) -> dict[str, Any]:
    last = last or {}
    return {
        "phase": phase,
        "name": name,
        "file": last.get("file"),
        "done_bytes": last.get("done_bytes", 0),
        "total_bytes": last.get("total_bytes", 0),
        "speed_bps": 0.0,
        "eta_s": None,
        "message": message,
    }


def cancelled_message(progress: dict[str, Any]) -> str:
    """What a cancelled download left. Downloads that name their file (hub files, a wheel fetched
    directly) write a partial the next pull resumes; a wheel fetched by pip (no file name: pip keeps
    no partial) starts over."""
    if progress.get("file"):
        return "Cancelled; the partial download is kept and the next pull resumes it."
    return "Cancelled; nothing was kept, the next pull starts over."
