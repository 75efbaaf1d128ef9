"""Rank 0's side of several pipeline steps in flight (`--pp N`): the messages to the workers and the
last stage's answers each move on a thread of their own, so rank 0's stage can run group B's step
while a later stage still runs group A's.

Why threads: gloo's send and broadcast wait until the peer posts the matching receive. A worker takes
the next step's message only after it has sent the step before's output to rank 0, so if rank 0's
main thread broadcast step B itself it would wait for the last stage to finish step A before it could
start B (no overlap), and if it only received A's output after sending B's hidden states the two
ranks would wait on each other (the last stage's output send against rank 0's hidden-state send).
With the broadcast queued on one thread and the outputs received on another as soon as a step is
submitted, each rank only ever waits for work that is already under way. Each thread uses its own
process group (control, results), the main thread the default one (hidden states): gloo allows
that. The workers are unchanged: they run the steps in the order rank 0 sent them.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import torch.distributed as dist


class ControlChannel:
    """Broadcasts rank 0's messages to every worker, in order, from one thread. `send(wait=False)`
    returns at once (a step), `send()` when the workers have the message (setup calls, shutdown)."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self._queue: queue.SimpleQueue[tuple[Any, Future[None]]] = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="localchat-pp-control", daemon=True)
        self._thread.start()

    def send(self, message: Any, wait: bool = True) -> None:
        if self._error is not None:  # an earlier message that nobody waited for failed
            raise self._error
        done: Future[None] = Future()
        self._queue.put((message, done))
        if wait:
            done.result()

    def _run(self) -> None:
        while True:
            message, done = self._queue.get()
            try:
                dist.broadcast_object_list([message], src=0, group=self.group)
            except BaseException as exc:  # handed to the caller
                self._error = exc
                done.set_exception(exc)
                continue
            done.set_result(None)


class ResultsInbox:
    """The last stage's output of each submitted step, received on a thread in submission order
    (`receive` is the stage runner's blocking receive from the last rank)."""

    def __init__(self, receive: Callable[[], Any]) -> None:
        self._receive = receive
        self._expected = threading.Semaphore(0)
        self._outputs: queue.SimpleQueue[tuple[Any, BaseException | None]] = queue.SimpleQueue()
        self.pending = 0  # steps submitted whose output has not been taken
        self._thread = threading.Thread(target=self._run, name="localchat-pp-results", daemon=True)
        self._thread.start()

    def expect(self) -> None:
        """A step was submitted: receive its output."""
        self.pending += 1
        self._expected.release()

    def take(self) -> Any:
        """The oldest submitted step's output (waits for it); raises what receiving it raised."""
        assert self.pending > 0, "no step in flight"
        self.pending -= 1
        output, error = self._outputs.get()
        if error is not None:
            raise error
        return output

    def _run(self) -> None:
        while True:
            self._expected.acquire()
            try:
                self._outputs.put((self._receive(), None))
            except BaseException as exc:  # handed to the caller
                self._outputs.put((None, exc))
