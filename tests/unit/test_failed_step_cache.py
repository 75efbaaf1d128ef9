"""A step that fails leaves no cached K/V behind: blocks named for it (their content never written) are
forgotten, so a later request with the same prompt computes it instead of reading garbage. The fake
runner checks every context it reads, so a hit on an unwritten block fails the drain."""

from __future__ import annotations

import pytest

from localchat.engine.engine import LLMEngine
from localchat.engine.interface import BatchInputs, RunnerOutput, SchedulerOutput
from localchat.engine.request import FinishReason
from localchat.engine.sampling_params import SamplingParams
from tests.helpers.fake_engine import chat_prompt, drain, fake_engine

PROMPT = chat_prompt("say: a reply long enough to matter " * 3)


def fail_next_step(engine: LLMEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner's next step raises before writing anything, as a device error would."""
    real = engine.runner.execute_model

    def broken(scheduler_output: SchedulerOutput, batch: BatchInputs) -> RunnerOutput:
        monkeypatch.setattr(engine.runner, "execute_model", real)
        raise RuntimeError("device lost")

    monkeypatch.setattr(engine.runner, "execute_model", broken)


def run(engine: LLMEngine, req_id: str, prompt: list[int]) -> list[int]:
    engine.add_request(prompt, SamplingParams(max_tokens=6), req_id)
    tokens: list[int] = []
    for out in drain(engine):
        tokens += out.new_token_ids
    return tokens


def test_a_failed_prefill_leaves_no_cache_hit(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = fake_engine()
    assert len(PROMPT) > 3 * engine.config.block_size
    fail_next_step(engine, monkeypatch)
    engine.add_request(PROMPT, SamplingParams(max_tokens=6), "a")
    (out,) = engine.step()
    assert out.finish_reason == FinishReason.ERROR and "device lost" in (out.error or "")
    assert engine.scheduler.block_manager.cached_blocks == {}
    hits_before = engine.scheduler.block_manager.prefix_hits
    cold = run(fake_engine(), "cold", PROMPT)
    assert run(engine, "b", PROMPT) == cold  # drain raises if b read an unwritten block
    assert engine.scheduler.block_manager.prefix_hits == hits_before


def test_a_failed_decode_keeps_the_prompt_it_had_written(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks written by earlier steps stay cached: only what the failed step named is forgotten."""
    engine = fake_engine()
    bs = engine.config.block_size
    engine.add_request(PROMPT, SamplingParams(max_tokens=40, ignore_eos=True), "a")
    engine.step()  # the prompt, all of it written
    while engine.scheduler.requests["a"].num_computed_tokens % bs != bs - 1:
        engine.step()  # the next decode step fills a block
    fail_next_step(engine, monkeypatch)
    (out,) = engine.step()
    assert out.finish_reason == FinishReason.ERROR
    bm = engine.scheduler.block_manager
    hits_before = bm.prefix_hits
    cold = run(fake_engine(), "cold", PROMPT)
    assert run(engine, "b", PROMPT) == cold
    assert bm.prefix_hits - hits_before == len(PROMPT) - 1  # the prompt's blocks were kept


def test_twins_in_a_failed_step_leave_nothing_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """b is admitted in a's step with a's blocks as its hits (named there, written by that forward)."""
    engine = fake_engine()
    engine.add_request(PROMPT, SamplingParams(max_tokens=6), "a")
    engine.add_request(PROMPT, SamplingParams(max_tokens=6), "b")
    fail_next_step(engine, monkeypatch)
    outs = engine.step()
    assert sorted(o.req_id for o in outs) == ["a", "b"]
    assert all(o.finish_reason == FinishReason.ERROR for o in outs)
    bm = engine.scheduler.block_manager
    assert bm.cached_blocks == {} and bm.children == {}
    assert run(engine, "c", PROMPT) == run(fake_engine(), "cold", PROMPT)


def test_a_batch_that_cannot_be_built_fails_its_requests_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Building the step's inputs (e.g. a grammar's token mask) failing is a failed step too: its
    requests finish with the error, the engine goes on, and nothing it named stays cached."""
    engine = fake_engine()
    real = engine.build_batch

    def broken(scheduler_output: SchedulerOutput) -> BatchInputs:
        monkeypatch.setattr(engine, "build_batch", real)
        raise ValueError("mask failed")

    monkeypatch.setattr(engine, "build_batch", broken)
    engine.add_request(PROMPT, SamplingParams(max_tokens=6), "a")
    (out,) = engine.step()
    assert out.finish_reason == FinishReason.ERROR and "mask failed" in (out.error or "")
    assert engine.scheduler.block_manager.cached_blocks == {}
    assert run(engine, "b", PROMPT) == run(fake_engine(), "cold", PROMPT)
