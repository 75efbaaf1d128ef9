"""The batching engine of an encoder model: one worker task per event loop takes the waiting inputs,
longest first, into one forward pass whose padded size (longest input x count) stays under a token
budget, runs it on a thread, and hands each input its row. A pass that raises fails only the inputs in
it. A full queue answers 503 (QueueFullError) at once instead of growing without bound.

The worker starts lazily, inside the running loop of the first `submit` (never at construction, which
may happen outside any loop), and restarts if a later call comes from another loop (each test's
`asyncio.run`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from localchat.embeddings.text import Encoded
from localchat.errors import QueueFullError

log = logging.getLogger("localchat")

# One forward pass over a batch -> one row per input (a vector, or a score as a 1-element row).
BatchFn = Callable[[list[Encoded]], np.ndarray]


@dataclass(slots=True)
class _Job:
    item: Encoded
    future: asyncio.Future[np.ndarray]


class BatchingEncoder:
    def __init__(
        self,
        run_batch: BatchFn,
        *,
        max_batch_tokens: int = 16_384,
        max_batch_size: int = 128,
        max_queue: int = 4096,
    ) -> None:
        self._run_batch = run_batch
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_size = max_batch_size
        self.max_queue = max_queue
        self._queue: deque[_Job] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self.passes = 0  # forward passes run, for tests and metrics

    @property
    def waiting(self) -> int:
        return len(self._queue)

    def _ensure_worker(self) -> asyncio.Event:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._task is None or self._task.done() or self._wake is None:
            if self._loop is not loop:
                self._queue.clear()  # jobs of a closed loop can never be answered
            self._loop = loop
            self._wake = asyncio.Event()
            self._task = loop.create_task(self._worker(self._wake), name="localchat-embeddings")
        return self._wake

    async def submit(self, items: Sequence[Encoded]) -> list[np.ndarray]:
        """One row per item, in order; raises the error of a failed pass, QueueFullError when full."""
        wake = self._ensure_worker()
        if len(self._queue) + len(items) > self.max_queue:
            raise QueueFullError(
                f"The embedding queue is full ({len(self._queue)} inputs waiting); retry shortly."
            )
        loop = asyncio.get_running_loop()
        jobs = [_Job(item, loop.create_future()) for item in items]
        self._queue.extend(jobs)
        wake.set()
        try:
            results = await asyncio.gather(*(j.future for j in jobs), return_exceptions=True)
        except asyncio.CancelledError:
            for job in jobs:  # the worker skips them
                job.future.cancel()
            raise
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return [r for r in results if isinstance(r, np.ndarray)]

    def _take(self) -> list[_Job]:
        """The next pass: the longest waiting inputs first, as many as fit the padded-token budget."""
        live = sorted((j for j in self._queue if not j.future.done()), key=lambda j: -len(j.item))
        batch: list[_Job] = []
        for job in live:
            width = len(batch[0].item) if batch else len(job.item)
            if batch and (
                width * (len(batch) + 1) > self.max_batch_tokens or len(batch) >= self.max_batch_size
            ):
                break
            batch.append(job)
        taken = {id(j) for j in batch}
        self._queue = deque(j for j in self._queue if id(j) not in taken and not j.future.done())
        return batch

    async def _worker(self, wake: asyncio.Event) -> None:
        while True:
            if not self._queue:
                wake.clear()
                await wake.wait()
                continue
            batch = self._take()
            if not batch:
                continue
            try:
                rows = await asyncio.to_thread(self._run_batch, [j.item for j in batch])
                if len(rows) != len(batch):
                    raise RuntimeError(f"the encoder answered {len(rows)} rows for {len(batch)} inputs")
            except Exception as exc:  # this pass's inputs fail; the worker goes on
                log.warning("embedding pass of %d inputs failed: %s", len(batch), exc)
                for job in batch:
                    if not job.future.done():
                        job.future.set_exception(exc)
                continue
            self.passes += 1
            for job, row in zip(batch, rows, strict=True):
                if not job.future.done():
                    job.future.set_result(row)

    async def aclose(self) -> None:
        """Stop the worker (waiting requests are cancelled)."""
        task, self._task = self._task, None
        for job in self._queue:
            job.future.cancel()
        self._queue.clear()
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
