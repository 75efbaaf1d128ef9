"""Deferred delivery (engine/handoff.py): a step's outputs reach callers as the next step's compute
starts, in order, and never after their request's final output."""

from __future__ import annotations

import threading

import pytest

from localchat.backends.fake import FakeRunner, FakeTokenizer
from localchat.engine import handoff
from localchat.engine.async_engine import AsyncEngine
from localchat.engine.config import EngineConfig
from localchat.engine.engine import LLMEngine
from localchat.engine.interface import BatchInputs, RunnerOutput, SchedulerOutput
from localchat.engine.outputs import RequestOutput
from localchat.engine.sampling_params import SamplingParams
from tests.helpers.fake_engine import chat_prompt


class FlushingRunner(FakeRunner):
    """The fake runner, flushing before each step's work as the torch runner does."""

    flushes_handoff = True

    def __init__(self) -> None:
        super().__init__(kv_bytes_per_token=128)
        self.in_step = False

    def execute_model(self, scheduler_output: SchedulerOutput, batch: BatchInputs) -> RunnerOutput:
        self.in_step = True
        try:
            handoff.flush()
            return super().execute_model(scheduler_output, batch)
        finally:
            self.in_step = False


def _engine() -> tuple[AsyncEngine, FlushingRunner]:
    runner = FlushingRunner()
    engine = LLMEngine(
        runner, FakeTokenizer(), EngineConfig(kv_cache_mib=1), eos_token_ids=[2], model_max_len=4096
    )
    async_engine = AsyncEngine(engine)
    async_engine.start()
    return async_engine, runner


def test_flush_runs_deferred_calls_once_in_order_and_per_thread() -> None:
    calls: list[int] = []
    handoff.defer(lambda: calls.append(1))
    handoff.defer(lambda: calls.append(2))
    other: list[bool] = []
    thread = threading.Thread(target=lambda: other.append(handoff.pending()))
    thread.start()
    thread.join()
    assert other == [False] and handoff.pending()
    handoff.flush()
    handoff.flush()
    assert calls == [1, 2] and not handoff.pending()


def test_a_failing_delivery_keeps_the_rest_for_the_next_flush() -> None:
    calls: list[str] = []

    def boom() -> None:
        raise RuntimeError("sink failed")

    handoff.defer(boom)
    handoff.defer(lambda: calls.append("after"))
    with pytest.raises(RuntimeError):
        handoff.flush()
    assert calls == [] and handoff.pending()
    handoff.flush()
    assert calls == ["after"]


def test_outputs_arrive_inside_the_next_step_and_the_last_at_once() -> None:
    engine, runner = _engine()
    try:
        done = threading.Event()
        seen: list[tuple[RequestOutput, bool]] = []

        def sink(out: RequestOutput) -> None:  # a plain callable: runs on the engine thread
            seen.append((out, runner.in_step))
            if out.finished:
                done.set()

        engine.submit(chat_prompt("<<say:hello there world>>"), SamplingParams(max_tokens=50), sink)
        assert done.wait(10)
        outs = [out for out, _ in seen]
        assert "".join(o.text_delta for o in outs) == "hello there world"
        assert [o.finished for o in outs] == [False] * (len(outs) - 1) + [True]
        # Every output but the last came out at the start of the following step's compute; the last
        # (no step follows) right after its own step.
        assert all(inside for _, inside in seen[:-1]) and not seen[-1][1]
        counts = [o.num_output_tokens for o in outs]
        assert counts == sorted(counts)
    finally:
        engine.shutdown(drain_timeout_s=1)


def test_an_abort_never_overtakes_a_deferred_output() -> None:
    engine, _ = _engine()
    try:
        done = threading.Event()
        seen: list[RequestOutput] = []
        req: list[str] = []

        def sink(out: RequestOutput) -> None:
            seen.append(out)
            if len(seen) == 3:
                engine.abort(req[0])
            if out.finished:
                done.set()

        slow = chat_prompt("<<slow:5>><<say:" + "w" * 200 + ">>")
        req.append(engine.submit(slow, SamplingParams(max_tokens=300), sink))
        assert done.wait(10)
        threading.Event().wait(0.05)  # anything delivered after the final output would land by now
        assert seen[-1].finished and sum(o.finished for o in seen) == 1
        # No output dropped either: every token the request made reached the caller.
        assert sum(len(o.new_token_ids) for o in seen) == seen[-1].num_output_tokens
        assert engine.num_in_flight == 0
    finally:
        engine.shutdown(drain_timeout_s=1)
