"""The engine loop on the fake runner, which checks every context it reads through the block tables."""

from __future__ import annotations

import pytest

from localchat.backends.fake import FakeRunner
from localchat.engine.engine import LLMEngine
from localchat.engine.request import FinishReason
from localchat.engine.sampling_params import SamplingParams
from localchat.errors import ContextLengthExceededError
from tests.helpers.fake_engine import chat_prompt, drain, fake_engine

KV_BYTES_PER_TOKEN = 128  # the fake runner's default


def run_all(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams) -> dict[str, str]:
    ids = [engine.add_request(p, params) for p in prompts]
    texts = dict.fromkeys(ids, "")
    reasons: dict[str, FinishReason | None] = {}
    for out in drain(engine):  # raises on an error finish (e.g. the fake runner saw a corrupted KV cache)
        texts[out.req_id] += out.text_delta
        if out.finished:
            reasons[out.req_id] = out.finish_reason
    assert set(reasons) == set(ids), "every request must finish"
    return {i: texts[i] for i in ids}


def test_single_request_streams_its_reply_and_stops_at_eos() -> None:
    engine = fake_engine()
    texts = run_all(engine, [chat_prompt("<<say:Hi there, wörld ✓>>")], SamplingParams(max_tokens=100))
    assert list(texts.values()) == ["Hi there, wörld ✓"]
    assert engine.block_manager.num_used_blocks == 0


def test_max_tokens_finishes_with_length() -> None:
    engine = fake_engine()
    engine.add_request(chat_prompt("<<say:abcdefgh>>"), SamplingParams(max_tokens=3))
    outs = list(drain(engine))
    assert outs[-1].finish_reason == FinishReason.LENGTH and outs[-1].num_output_tokens == 3
    assert "".join(o.text_delta for o in outs) == "abc"


def test_many_requests_under_a_tiny_kv_budget_preempt_but_match_running_alone() -> None:
    prompts = [chat_prompt(f"<<say:reply number {i} " + "x" * (i * 3) + ">>") for i in range(16)]
    alone = [
        next(iter(run_all(fake_engine(), [p], SamplingParams(max_tokens=200)).values())) for p in prompts
    ]
    # 1 MiB at 4 KiB per token = 256 tokens, about 2 of these requests: forces preemption and recompute.
    engine = fake_engine(kv_bytes_per_token=4096, block_size=4)
    assert engine.block_manager.num_usable_blocks == 64
    together = list(run_all(engine, prompts, SamplingParams(max_tokens=200)).values())
    assert together == alone
    assert engine.scheduler.num_preemptions > 0
    assert engine.block_manager.num_used_blocks == 0


def test_prefix_cache_hits_are_reported_as_cached_tokens() -> None:
    engine = fake_engine(block_size=4)
    prompt = chat_prompt("<<say:ok>> a long shared system prompt " * 3)
    run_all(engine, [prompt], SamplingParams(max_tokens=5))
    engine.add_request(prompt, SamplingParams(max_tokens=5))
    outs = list(drain(engine))
    # Whole blocks, then the last block's first tokens copied (partial reuse): all but the last token.
    assert outs[-1].num_cached_tokens == len(prompt) - 1
    assert engine.block_manager.prefix_hit_rate > 0


def test_stop_string_spanning_tokens_is_cut_and_never_emitted() -> None:
    engine = fake_engine()
    params = SamplingParams(max_tokens=100, stop=["STOP", "é!"])
    engine.add_request(chat_prompt("<<say:one two ST three STOP four>>"), params)
    outs = list(drain(engine))
    deltas = [out.text_delta for out in outs]
    assert "".join(deltas) == "one two ST three "
    assert not any("S" in d and "T" in d and "STOP" in d for d in deltas)
    assert outs[-1].finish_reason == FinishReason.STOP and outs[-1].stop_reason == "STOP"


def test_abort_frees_blocks_and_reports_abort() -> None:
    engine = fake_engine()
    req_id = engine.add_request(chat_prompt("<<say:" + "y" * 200 + ">>"), SamplingParams(max_tokens=300))
    for _ in range(5):
        engine.step()
    assert engine.block_manager.num_used_blocks > 0
    out = engine.abort_request(req_id)
    assert out is not None and out.finished and out.finish_reason == FinishReason.ABORT
    assert engine.block_manager.num_used_blocks == 0
    assert engine.abort_request(req_id) is None


def test_prompt_longer_than_the_context_is_a_typed_error() -> None:
    engine = fake_engine(max_model_len=64)
    with pytest.raises(ContextLengthExceededError) as err:
        engine.add_request(list(range(3, 80)), SamplingParams())
    assert "64" in err.value.message and "77" in err.value.message


def test_generation_stops_at_the_context_length() -> None:
    engine = fake_engine(max_model_len=160)
    engine.add_request(chat_prompt("<<say:" + "z" * 100 + ">>"), SamplingParams(max_tokens=1000))
    outs = list(drain(engine))
    assert outs[-1].finish_reason == FinishReason.LENGTH
    assert outs[-1].num_prompt_tokens + outs[-1].num_output_tokens == 160


def test_runner_failure_fails_the_step_requests_but_not_the_engine() -> None:
    engine = fake_engine()
    boom = engine.runner.execute_model
    calls = {"n": 0}

    def flaky(so, batch):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("device lost")
        return boom(so, batch)

    engine.runner.execute_model = flaky  # type: ignore[method-assign]
    engine.add_request(chat_prompt("<<say:hello>>"), SamplingParams(max_tokens=50))
    engine.step()
    (out,) = engine.step()
    assert out.finished and out.finish_reason == FinishReason.ERROR and "device lost" in (out.error or "")
    assert engine.stats().requests_failed_total == 1
    assert engine.block_manager.num_used_blocks == 0
    texts = run_all(engine, [chat_prompt("<<say:still alive>>")], SamplingParams(max_tokens=50))
    assert list(texts.values()) == ["still alive"]


def test_kv_pool_size_comes_from_the_mib_budget() -> None:
    engine = fake_engine(kv_cache_mib=2, block_size=16)
    assert engine.block_manager.num_usable_blocks == 2 * 2**20 // (KV_BYTES_PER_TOKEN * 16)


def test_kv_corruption_fails_the_test_helpers_loudly() -> None:
    """The fake runner's context check raises inside execute_model; the engine survives it by finishing
    the request with "error". Every helper that drives an engine must turn that into a test failure."""
    engine = fake_engine(block_size=4)
    engine.add_request(chat_prompt("<<say:" + "k" * 40 + ">>"), SamplingParams(max_tokens=60))
    for _ in range(3):
        engine.step()
    (request,) = engine.scheduler.requests.values()
    runner = engine.runner
    assert isinstance(runner, FakeRunner)
    runner.slots[request.block_ids[1] * 4] = (
        999  # a scheduler/block-manager bug, as a real model would see it
    )
    with pytest.raises(AssertionError, match=r"finished with an error: .*KV cache corrupted"):
        run_all(engine, [], SamplingParams(max_tokens=60))
    assert engine.block_manager.num_used_blocks == 0  # and the engine itself carried on


def test_latency_histograms_count_first_tokens_and_gaps() -> None:
    engine = fake_engine()
    engine.add_request(chat_prompt("<<slow:20>><<say:abcde>>"), SamplingParams(max_tokens=50))
    outs = list(drain(engine))
    stats = engine.stats()
    ttft, itl = stats.time_to_first_token, stats.inter_token_latency
    assert outs[-1].num_output_tokens == 6  # five letters and EOS
    assert ttft.count == 1 and ttft.total >= 0.02  # the first step (the prefill) slept 20 ms
    assert itl.count == 5 and itl.total >= 5 * 0.02
    assert itl.bounds[:3] == (0.005, 0.01, 0.02) and itl.cumulative[:2] == (0, 0)  # every gap >= 20 ms
    assert list(itl.cumulative) == sorted(itl.cumulative) and itl.cumulative[-1] <= itl.count
