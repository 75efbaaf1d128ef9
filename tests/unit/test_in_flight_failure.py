"""Steps in flight (engine/in_flight.py) when one fails: a later step already in flight may have been
scheduled to read the failed step's blocks (prefix hits on K/V it never wrote). That step's requests are
recomputed (their rows dropped, preempted), not failed and not left reading garbage, and what they named
is forgotten too. The fake runner with two steps in flight: each step runs when submitted and its output
comes back one step later; the failing step's K/V are garbled before it raises (a stage lost; slots a
later step wrote since keep that step's), so any later read of them fails the fake runner's context check.
The reads made while it was in flight pass, as a real model's would (silently wrong, without the fix)."""

from __future__ import annotations

from collections import deque
from typing import Any, cast

import numpy as np

from localchat.backends.fake import EOS_ID, FakeRunner, FakeTokenizer
from localchat.engine.config import EngineConfig
from localchat.engine.engine import LLMEngine
from localchat.engine.interface import BatchInputs, RunnerOutput, SchedulerOutput
from localchat.engine.outputs import RequestOutput
from localchat.engine.request import FinishReason
from localchat.engine.sampling_params import SamplingParams
from tests.helpers.fake_engine import chat_prompt, drain, fake_engine

GARBAGE = -7
P = chat_prompt("<<say:an answer long enough to outlast the failure>> " + "shared words " * 4)
Q = chat_prompt("and a follow-up question")
R = chat_prompt("and one more")


class Pipelined:
    """Two steps in flight on the fake runner; the `fail`-th submitted step raises at finish_step."""

    def __init__(self, fail: int) -> None:
        self.runner = FakeRunner()
        self.steps_in_flight = 2
        self.fail = fail
        self.queue: deque[tuple[int, BatchInputs, RunnerOutput]] = deque()
        self.submitted = 0
        self.writer = np.full(0, -1, dtype=np.int64)  # the step that last wrote each slot

    def __getattr__(self, name: str) -> Any:
        return getattr(self.runner, name)

    def submit_step(self, scheduler_output: SchedulerOutput, batch: BatchInputs) -> None:
        self.queue.append((self.submitted, batch, self.runner.execute_model(scheduler_output, batch)))
        if len(self.writer) != len(self.runner.slots):
            self.writer = np.full(len(self.runner.slots), -1, dtype=np.int64)
        self.writer[batch.slot_mapping] = self.submitted
        self.submitted += 1

    def finish_step(self) -> RunnerOutput:
        index, batch, output = self.queue.popleft()
        if index == self.fail:
            mine = batch.slot_mapping[self.writer[batch.slot_mapping] == index]
            self.runner.slots[mine] = GARBAGE  # what it wrote is not to be trusted
            raise RuntimeError("stage 1 lost")
        return output


def engine_failing_at(step: int) -> LLMEngine:
    config = EngineConfig(kv_cache_mib=1, block_size=4, watermark_fraction=0.0)
    runner = cast(Any, Pipelined(step))
    engine = LLMEngine(runner, FakeTokenizer(), config, eos_token_ids=[EOS_ID], model_max_len=4096)
    assert engine.in_flight is not None
    return engine


def params() -> SamplingParams:
    return SamplingParams(max_tokens=60)


def cold(prompt: list[int]) -> list[int]:
    engine = fake_engine(block_size=4)
    engine.add_request(prompt, params())
    return [t for out in drain(engine) for t in out.new_token_ids]


def collect(engine: LLMEngine, outs: list[RequestOutput], tokens: dict[str, list[int]]) -> None:
    for out in outs:
        tokens.setdefault(out.req_id, []).extend(out.new_token_ids)
        if out.finish_reason == FinishReason.ERROR:
            assert out.req_id in ("a", "b") and "stage 1 lost" in (out.error or ""), out.error


def run_to_end(engine: LLMEngine, tokens: dict[str, list[int]]) -> dict[str, FinishReason | None]:
    reasons: dict[str, FinishReason | None] = {}
    while engine.has_unfinished:
        outs = engine.step()
        collect(engine, outs, tokens)
        reasons.update({o.req_id: o.finish_reason for o in outs if o.finished})
    return reasons


def test_a_step_reading_a_failed_steps_blocks_is_recomputed() -> None:
    """b's step (P + Q, Q's blocks named there) fails while c's step, admitted with hits on those
    blocks, is in flight: c is recomputed and answers like a cold run; a, in c's step too, is untouched;
    nothing stays named that the failed step or c's step wrote."""
    engine = engine_failing_at(1)
    bm = engine.block_manager
    tokens: dict[str, list[int]] = {}
    engine.add_request(P, params(), "a")
    engine.add_request(P + Q, params(), "b")
    collect(engine, engine.step(), tokens)  # a's prefill back; b's (hits on a's blocks) in flight
    assert engine.scheduler.in_flight == {"b"}
    engine.add_request(P + Q + R, params(), "c")
    outs = engine.step()  # c admitted with hits on b's Q blocks, then b's step fails
    collect(engine, outs, tokens)
    assert [(o.req_id, o.finish_reason) for o in outs if o.finished] == [("b", FinishReason.ERROR)]
    c = engine.scheduler.requests["c"]
    assert c.num_cached_tokens >= len(P + Q) - 3  # c did hit b's blocks
    assert "c" in engine.in_flight.redo  # type: ignore[union-attr]
    assert all(bm.blocks[b].block_hash is None for b in c.block_ids[len(P) // 4 :])
    preemptions = engine.scheduler.num_preemptions
    reasons = run_to_end(engine, tokens)
    assert reasons == {"a": FinishReason.STOP, "c": FinishReason.STOP}
    assert engine.scheduler.num_preemptions == preemptions + 1  # c, once
    assert tokens["a"] == cold(P) and tokens["c"] == cold(P + Q + R)
    assert bm.num_free_blocks == bm.num_usable_blocks
    # The cache holds nothing either step wrote: the same prompts again read only what was recomputed.
    engine.add_request(P + Q + R, params(), "d")
    engine.add_request(P + Q, params(), "e")
    assert run_to_end(engine, tokens) == {"d": FinishReason.STOP, "e": FinishReason.STOP}
    assert tokens["d"] == cold(P + Q + R) and tokens["e"] == cold(P + Q)


def test_blocks_of_a_request_aborted_in_flight_are_forgotten_when_its_step_fails() -> None:
    """b is aborted while its step is in flight (freeing names its blocks for reuse), then that step
    fails: its blocks are unnamed all the same, and c, which hit them meanwhile, is recomputed."""
    engine = engine_failing_at(1)
    tokens: dict[str, list[int]] = {}
    engine.add_request(P, params(), "a")
    engine.add_request(P + Q, params(), "b")
    collect(engine, engine.step(), tokens)
    assert engine.abort_request("b") is not None
    engine.add_request(P + Q + R, params(), "c")
    collect(engine, engine.step(), tokens)  # c hits b's freed blocks; b's step fails (nobody left)
    assert run_to_end(engine, tokens) == {"a": FinishReason.STOP, "c": FinishReason.STOP}
    assert tokens["c"] == cold(P + Q + R)
    engine.add_request(P + Q, params(), "e")
    assert run_to_end(engine, tokens) == {"e": FinishReason.STOP}
    assert tokens["e"] == cold(P + Q)


def test_a_partial_copy_from_a_failed_steps_block_is_recomputed() -> None:
    """a's prompt in two chunks: its first chunk's blocks are written (that step came back), its last
    block is named by the step that fails. c, admitted while that step is in flight, hits the written
    blocks and copies the first tokens of that last block (a partial copy's source): c is recomputed.
    (The fake runner copies token ids at submit, before the garbling, so only the recompute shows it.)"""
    config = EngineConfig(kv_cache_mib=1, block_size=4, watermark_fraction=0.0, prefill_chunk_size=120)
    runner = Pipelined(1)
    engine = LLMEngine(cast(Any, runner), FakeTokenizer(), config, eos_token_ids=[EOS_ID], model_max_len=4096)
    assert len(P) == 124
    tokens: dict[str, list[int]] = {}
    engine.add_request(P, params(), "a")
    collect(engine, engine.step(), tokens)  # a's first chunk [0, 120), back
    other = [*P[:122], *R]  # parts from P inside its last block
    engine.add_request(other, params(), "c")
    copies: list[tuple[int, int, int]] = []
    real = runner.submit_step

    def recording(scheduler_output: SchedulerOutput, batch: BatchInputs) -> None:
        copies.extend(scheduler_output.kv_copies)
        real(scheduler_output, batch)

    runner.submit_step = recording  # type: ignore[method-assign]
    outs = engine.step()  # a's last chunk (fails), c admitted with the copy
    assert [(o.req_id, o.finish_reason) for o in outs] == [("a", FinishReason.ERROR)]
    assert len(copies) == 1 and copies[0][2] == 2
    assert run_to_end(engine, tokens) == {"c": FinishReason.STOP}
    assert tokens["c"] == cold(other)
    assert engine.scheduler.num_preemptions == 1
