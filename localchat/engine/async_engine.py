"""Runs an `LLMEngine` on its own thread. Callers (async HTTP handlers, the UI, the library) submit
requests through a thread-safe inbox and receive `RequestOutput`s through a per-request sink."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from localchat.engine.engine import LLMEngine
from localchat.engine.outputs import EngineStats, RequestOutput
from localchat.engine.request import FinishReason, ImageInput
from localchat.engine.sampling_params import SamplingParams
from localchat.errors import (
    ContextLengthExceededError,
    EngineDeadError,
    InvalidRequestError,
    ModelFailedError,
    QueueFullError,
)
from localchat.host_memory import trim_heap

log = logging.getLogger(__name__)

# The stats snapshot is rebuilt after a step that ends a request or follows a new command, and otherwise at
# most this often: rebuilding it cost ~0.1 ms a decode token (its 10 s token-rate window), and its readers
# (/metrics, /health) poll far less often than tokens come.
STATS_REFRESH_S = 0.05


@dataclass(frozen=True, slots=True)
class LoopSink:
    """Runs `callback(*args, output)` on an asyncio loop. The engine thread hands all of one step's
    outputs for a loop over in a single `call_soon_threadsafe`: one wake-up of the HTTP thread per step
    instead of one per request, which keeps it off the GIL while the model runs."""

    loop: asyncio.AbstractEventLoop
    callback: Callable[..., object]
    args: tuple[Any, ...] = ()

    def __call__(self, output: RequestOutput) -> None:
        self.loop.call_soon_threadsafe(_run_batch, [(self, output)])


Sink = LoopSink | Callable[[RequestOutput], object]  # a plain callable runs on the engine thread


@dataclass(slots=True)
class _Add:
    req_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    sink: Sink
    arrival_time: float  # time.monotonic() at submit: the queue wait counts in time to first token
    images: tuple[ImageInput, ...] = ()


@dataclass(slots=True)
class _Abort:
    req_id: str


class AsyncEngine:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.max_in_flight = engine.config.max_num_seqs + engine.config.max_queue_len
        self._inbox: queue.SimpleQueue[_Add | _Abort | None] = queue.SimpleQueue()
        self._sinks: dict[str, Sink] = {}
        self._lock = threading.Lock()
        self._in_flight = 0
        self._next_id = 0
        self._accepting = True
        self._thread: threading.Thread | None = None
        self._stats = engine.stats()
        self._stats_at = time.monotonic()

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def num_in_flight(self) -> int:
        return self._in_flight

    @property
    def failure(self) -> str | None:
        """Why the model cannot run any more (e.g. a tensor-parallel worker died), else None. Runners
        that can fail for good expose a `failure` string (backends/torch/parallel/driver.py)."""
        failure = getattr(self.engine.runner, "failure", None)
        return failure if isinstance(failure, str) else None

    def stats(self) -> EngineStats:
        return self._stats  # a snapshot the engine thread replaces after every step

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="localchat-engine", daemon=True)
        self._thread.start()

    # -- callers' side (any thread) ------------------------------------------------------------------

    def submit(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        sink: Sink,
        req_id: str | None = None,
        images: tuple[ImageInput, ...] = (),
    ) -> str:
        """Queue a request; `sink` is called on the engine thread with each output. Raises at once for
        a prompt that cannot fit, a full queue, or an engine that is stopping."""
        if not prompt_token_ids:
            raise InvalidRequestError("The prompt is empty.", param="prompt")
        if len(prompt_token_ids) >= self.max_model_len:
            raise ContextLengthExceededError(len(prompt_token_ids), self.max_model_len)
        with self._lock:
            if not self._accepting or not self.is_running:
                raise EngineDeadError("The engine is not running (shutting down or stopped).")
            if (failure := self.failure) is not None:
                raise ModelFailedError(failure)
            if self._in_flight >= self.max_in_flight:
                raise QueueFullError(
                    f"The server is busy ({self._in_flight} requests in flight). Retry shortly."
                )
            self._in_flight += 1
            if req_id is None:
                self._next_id += 1
                req_id = f"req-{self._next_id}"
        self._inbox.put(_Add(req_id, list(prompt_token_ids), params, sink, time.monotonic(), tuple(images)))
        return req_id

    def abort(self, req_id: str) -> None:
        self._inbox.put(_Abort(req_id))

    async def generate(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        req_id: str | None = None,
        images: tuple[ImageInput, ...] = (),
    ) -> AsyncIterator[RequestOutput]:
        """Stream one request's outputs. Leaving the loop early (client gone) aborts the request."""
        loop = asyncio.get_running_loop()
        outputs: asyncio.Queue[RequestOutput] = asyncio.Queue()
        req_id = self.submit(prompt_token_ids, params, LoopSink(loop, outputs.put_nowait), req_id, images)
        finished = False
        try:
            while not finished:
                output = await outputs.get()
                finished = output.finished
                yield output
        finally:
            if not finished:
                self.abort(req_id)

    def shutdown(self, drain_timeout_s: float = 30.0) -> None:
        """Stop taking requests, let in-flight ones finish (up to the timeout), abort the rest, stop."""
        with self._lock:
            self._accepting = False
        deadline = time.monotonic() + drain_timeout_s
        while self._in_flight and time.monotonic() < deadline:
            time.sleep(0.02)
        for req_id in list(self._sinks):
            self.abort(req_id)
        self._inbox.put(None)
        if self._thread is not None:
            self._thread.join(timeout=10)

    # -- the engine thread ---------------------------------------------------------------------------

    def _loop(self) -> None:
        worked = False  # since the engine last went idle
        while True:
            block = not self.engine.has_unfinished
            if block and worked:
                # NOTE: the C heap keeps the freed temporaries of every batch shape served; handing them
                # back each time the engine goes idle keeps a long-running server's RSS flat.
                trim_heap()
                worked = False
            handled = False
            try:
                while True:
                    command = self._inbox.get(block=block)
                    block = False
                    handled = True
                    if command is None:
                        self._fail_all("The server shut down.")
                        return
                    self._handle(command)
            except queue.Empty:
                pass
            worked = worked or self.engine.has_unfinished
            try:
                outputs = self.engine.step()
            except Exception:  # a bug must cost the requests in flight, never the engine thread
                if (failure := self.failure) is not None:  # logged where it was found
                    self._fail_all(failure)
                else:
                    log.exception("engine step failed")
                    self._fail_all("Internal engine error; the request was stopped.")
                outputs = []
            # Stats first: a caller woken by its last output must already see the blocks it freed.
            now = time.monotonic()
            if handled or now - self._stats_at >= STATS_REFRESH_S or any(o.finished for o in outputs):
                self._stats, self._stats_at = self.engine.stats(), now
            self._deliver_step(outputs)

    def _handle(self, command: _Add | _Abort) -> None:
        if isinstance(command, _Abort):
            if (output := self.engine.abort_request(command.req_id)) is not None:
                self._deliver(output)
            return
        try:
            if command.req_id in self._sinks:
                raise InvalidRequestError(f"Request id {command.req_id!r} is already in use.")
            self.engine.add_request(
                command.prompt_token_ids,
                command.params,
                command.req_id,
                command.arrival_time,
                images=command.images,
            )
            self._sinks[command.req_id] = command.sink
        except Exception as exc:
            message = getattr(exc, "message", str(exc))
            with self._lock:
                self._in_flight -= 1
            try:
                command.sink(RequestOutput(command.req_id, [], "", True, FinishReason.ERROR, error=message))
            except Exception:
                log.debug("sink for %s failed", command.req_id, exc_info=True)

    def _deliver_step(self, outputs: list[RequestOutput]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[LoopSink, RequestOutput]]] = {}
        for output in outputs:
            sink = self._sinks.get(output.req_id)
            if isinstance(sink, LoopSink):
                self._retire(output)
                by_loop.setdefault(sink.loop, []).append((sink, output))
            else:
                self._deliver(output)
        for loop, batch in by_loop.items():
            try:
                loop.call_soon_threadsafe(_run_batch, batch)
            except RuntimeError:  # that loop is closed: its requests are over for their callers anyway
                log.debug("event loop closed; %d outputs dropped", len(batch))

    def _retire(self, output: RequestOutput) -> None:
        if output.finished:
            self._sinks.pop(output.req_id, None)
            with self._lock:
                self._in_flight -= 1

    def _deliver(self, output: RequestOutput) -> None:
        sink = self._sinks.get(output.req_id)
        self._retire(output)
        if sink is None:
            return
        try:
            sink(output)
        except Exception:  # e.g. the caller's event loop is closed; the request is over for it anyway
            log.debug("sink for %s failed", output.req_id, exc_info=True)

    def _fail_all(self, message: str) -> None:
        for req_id in list(self.engine.scheduler.requests):
            output = self.engine.abort_request(req_id)
            if output is not None:
                output.finish_reason, output.error = FinishReason.ERROR, message
                self.engine.requests_failed_total += 1
                self._deliver(output)


def _run_batch(batch: list[tuple[LoopSink, RequestOutput]]) -> None:
    for sink, output in batch:
        try:
            sink.callback(*sink.args, output)
        except Exception:
            log.exception("output callback failed for %s", output.req_id)
