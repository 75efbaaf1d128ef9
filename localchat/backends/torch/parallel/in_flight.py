"""Rank 0's side of several pipeline steps in flight (`--pp N`): the messages to the workers and the
last stage's answers each move on a thread of their own, so rank 0's stage can run group B's step
while a later stage still runs group A's.

Why threads: gloo's send and broadcast wait until the peer posts the matching receive. A worker takes
the next step's message only after it has sent the step before's output to rank 0, so if rank 0's
main thread broadcast step B itself it would wait for the last stage to finish step A before it could
start B (no overlap), and if it only received A's output after sending B's hidden states the two
ranks would wait on each other (the last stage's output send against rank 0's hidden-state send).
With the messages queued on one thread and the outputs received on another as soon as a step is
submitted, each rank only ever waits for work that is already under way. Each thread uses its own
process group (control, results), the main thread the default one (hidden states) and, under TP x PP,
its stage's group (the all-reduces): gloo allows that. The workers are unchanged: they run the steps
in the order rank 0 sent them.

Why point-to-point and not a broadcast: gloo's broadcast is a binomial tree (with 4 ranks, rank 0
sends to 1 and 2, and rank 1 passes it on to 3), so a worker that is to forward a message waits in
the broadcast until its child posts the receive. Under TP=2 x PP=2 that makes rank 1 (stage 0) wait
for rank 3 (stage 1) to finish step A before it sees step B, and stage 0, whose ranks all-reduce
together, cannot start B: no overlap (measured: rank 1 left the broadcast 2.0 s late when rank 3
entered it 2 s late; with sends, at once). Sent rank by rank, a message reaches the first stage's
ranks first, and no worker ever waits on another worker to get it.
"""

from __future__ import annotations

import pickle
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import torch
import torch.distributed as dist


def send_message(message: Any, workers: range, group: Any) -> None:
    """`message` to each of `workers` in turn (rank 0's side): pickled once, then its size and bytes."""
    data = torch.frombuffer(bytearray(pickle.dumps(message)), dtype=torch.uint8)
    size = torch.tensor([data.numel()], dtype=torch.int64)
    for rank in workers:
        dist.send(size, dst=rank, group=group)
        dist.send(data, dst=rank, group=group)


def receive_message(group: Any) -> Any:
    """The next message from rank 0 (a worker's side of `send_message`)."""
    size = torch.empty(1, dtype=torch.int64)
    dist.recv(size, src=0, group=group)
    data = torch.empty(int(size.item()), dtype=torch.uint8)
    dist.recv(data, src=0, group=group)
    return pickle.loads(data.numpy().tobytes())  # rank 0 of our own group wrote it


_STOP = object()  # ControlChannel.close's message to its thread
CLOSE_WAIT_S = 5.0


class ControlChannel:
    """Sends rank 0's messages to every worker, in order, from one thread (rank by rank: the first
    stage's workers get a step first). `send(wait=False)` returns at once (a step), `send()` when the
    workers have the message (setup calls, shutdown)."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self.workers = range(1, dist.get_world_size())
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

    def close(self) -> None:
        """End the sending thread after what is queued: while it lives it holds the group, and with it
        the group's sockets and event loop (~15 descriptors a runner) past destroy_process_group."""
        self._queue.put((_STOP, Future()))
        self._thread.join(timeout=CLOSE_WAIT_S)  # bounded: a send to a dead worker may still be waiting
        self.group = None

    def _run(self) -> None:
        while True:
            message, done = self._queue.get()
            if message is _STOP:
                return
            try:
                send_message(message, self.workers, self.group)
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
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="localchat-pp-results", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """End the receiving thread: while it lives it holds the stage runner and so the results
        group (its sockets and event loop) past destroy_process_group, as the control thread did."""
        self._closing = True
        self._expected.release()
        self._thread.join(timeout=CLOSE_WAIT_S)  # bounded: a receive from a dead rank may still wait
        self._receive = _closed_receive

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
            if self._closing:
                return
            try:
                self._outputs.put((self._receive(), None))
            except BaseException as exc:  # handed to the caller
                self._outputs.put((None, exc))


def _closed_receive() -> Any:
    raise RuntimeError("the results inbox is closed")
