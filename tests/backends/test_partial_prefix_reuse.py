"""Partial prefix reuse on real engines (engine/block_manager.py `find_partial`): a repeated prompt
computes only its last token, a prompt that shares a cached prefix up to the middle of a block computes
only what follows, and in both the greedy tokens and the logprobs (top 5) equal a cold run's.

The copied block is checked to be a different block from its source (so the copy, not a leftover, put
the K/V there), the source unchanged right after the step that copied from it, and the runs are checked
to move when the copy is skipped (so the comparison can see a wrong copy). Tiny random models, float32:
a repeated prompt's last token then runs as a one-token row instead of inside the prefill, which moves
logprobs by ~1e-6; LOGPROB_ATOL 1e-4 is the parity suite's bound (tests/helpers/parity.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from localchat.backends import RunnerOptions
from localchat.backends.fake import FakeTokenizer
from localchat.backends.torch.kv_cache import Int8KVCache
from localchat.backends.torch.parallel.driver import ParallelRunner
from localchat.backends.torch.parallel.micro_batches import micro_batches
from localchat.backends.torch.runner import TorchRunner
from localchat.engine.config import EngineConfig
from localchat.engine.engine import LLMEngine
from localchat.engine.interface import BatchInputs, RunnerOutput, SchedulerOutput
from localchat.engine.sampling_params import SamplingParams
from localchat.weights.bundle import ModelBundle
from tests.helpers.fake_engine import drain
from tests.helpers.torch_batch import PagedDriver
from tests.helpers.torch_models import TEST_DEVICE, VARIANTS, bundle_from_hf, tiny_hf_model

LOGPROB_ATOL = 1e-4
QUANTIZED_ATOL = 0.05
BLOCK = 4
RNG = np.random.default_rng(7)
PROMPT = [int(t) for t in RNG.integers(3, 250, size=23)]  # 5 full blocks of 4, then 3 tokens
OTHER_TAIL = [int(t) for t in RNG.integers(3, 250, size=9)]
PARAMS = SamplingParams(temperature=0.0, max_tokens=8, logprobs=5, ignore_eos=True)

Run = tuple[list[int], list[list[tuple[int, float]]], int]  # tokens, top-5 logprobs per token, cached


class Recorder:
    """Wraps a runner's execute_model: keeps each step's (copies, tokens per request) and checks, after
    a step that copied, that each destination's first k slots hold exactly its source's (K/V, codes and
    scales alike) and that each source block holds what it held before the step (unless the source, a
    freed block at the head of the free list, was handed out as its own destination)."""

    def __init__(self, runner: Any, read_block: Callable[[int, int], np.ndarray] | None = None) -> None:
        self.steps: list[tuple[list[tuple[int, int, int]], dict[str, int]]] = []
        self.skip_copies = False
        inner = runner.execute_model

        def execute_model(out: SchedulerOutput, batch: BatchInputs) -> RunnerOutput:
            self.steps.append((list(batch.kv_copies), dict(out.num_scheduled_tokens)))
            if self.skip_copies:
                batch.kv_copies = []
            sources = {s: read_block(s, BLOCK) for s, _, _ in batch.kv_copies} if read_block else {}
            result = inner(out, batch)
            for source, dest, k in batch.kv_copies if read_block else []:
                assert read_block is not None
                if source == dest:  # a freed source handed out as its own destination: written now
                    continue
                assert np.array_equal(read_block(source, BLOCK), sources[source])
                assert np.array_equal(read_block(dest, k), read_block(source, k))
            return result

        runner.execute_model = execute_model

    def first_step_of(self, req_id: str) -> tuple[list[tuple[int, int, int]], int]:
        return next((c, n[req_id]) for c, n in self.steps if req_id in n)


def torch_block_reader(runner: TorchRunner) -> Callable[[int, int], np.ndarray]:
    def read(block: int, k: int) -> np.ndarray:
        slots = slice(block * BLOCK, block * BLOCK + k)
        parts = []
        for cache in runner.kv_caches:
            for t in (cache.codes, cache.scales) if isinstance(cache, Int8KVCache) else (cache,):
                parts.append(t[:, :, slots].float().cpu().numpy().ravel())
        return np.concatenate(parts)

    return read


def engine_on(runner: Any, **config: Any) -> LLMEngine:
    config.setdefault("block_size", BLOCK)
    return LLMEngine(runner, FakeTokenizer(), EngineConfig(**config), eos_token_ids=[2], model_max_len=256)


def run(engine: LLMEngine, prompt: list[int], req_id: str, params: SamplingParams = PARAMS) -> Run:
    engine.add_request(prompt, params, req_id=req_id)
    tokens: list[int] = []
    tops: list[list[tuple[int, float]]] = []
    cached = -1
    for out in drain(engine):
        tokens += out.new_token_ids
        tops += [lp.top for lp in out.logprobs]
        cached = out.num_cached_tokens
    return tokens, tops, cached


def assert_same(got: Run, want: Run, atol: float = LOGPROB_ATOL) -> None:
    if atol > LOGPROB_ATOL:  # a rounded cache: near-ties may flip, so the first token's top 5 only
        first_got, first_want = dict(got[1][0]), dict(want[1][0])
        assert len(first_got.keys() & first_want.keys()) >= 4
        for token in first_got.keys() & first_want.keys():
            assert abs(first_got[token] - first_want[token]) <= atol
        return
    assert got[0] == want[0]
    for row_got, row_want in zip(got[1], want[1], strict=True):
        assert [t for t, _ in row_got] == [t for t, _ in row_want]
        np.testing.assert_allclose([p for _, p in row_got], [p for _, p in row_want], atol=atol)


def torch_runner(bundle: ModelBundle, kv: str = "auto") -> TorchRunner:
    """On LOCALCHAT_TEST_DEVICE (benchmarks/gpu_check.sh sets cuda: Triton attention, decode graphs)."""
    options = RunnerOptions(device=TEST_DEVICE, dtype="float32", kv_cache_dtype=kv, seed=0)
    return TorchRunner(bundle, options)


def check_reuse(
    make_runner: Callable[[], Any], reader: Callable[[Any], Any], atol: float = LOGPROB_ATOL
) -> None:
    """A repeated prompt and one that shares 14 tokens (3 blocks and 2 of the next) with a cached one."""
    partly = PROMPT[:14] + OTHER_TAIL
    cold = {
        name: run(engine_on(make_runner()), p, "cold") for name, p in (("same", PROMPT), ("partly", partly))
    }
    runner = make_runner()
    engine = engine_on(runner)
    recorder = Recorder(runner, reader(runner))
    first = run(engine, PROMPT, "first")
    assert first[2] == 0
    assert_same(first, cold["same"], atol)

    again = run(engine, PROMPT, "again")
    assert_same(again, cold["same"], atol)
    assert again[2] == len(PROMPT) - 1  # 5 whole blocks and 2 tokens copied: 1 token computed
    copies, computed = recorder.first_step_of("again")
    assert computed == 1
    assert len(copies) == 1 and copies[0][2] == 2 and copies[0][0] != copies[0][1]

    shared = run(engine, partly, "partly")
    assert_same(shared, cold["partly"], atol)
    assert shared[2] == 14
    copies, computed = recorder.first_step_of("partly")
    assert computed == len(partly) - 14 and [c[2] for c in copies] == [2]

    # Without the copy the same run goes wrong: the comparison above can see a skipped or wrong copy.
    runner = make_runner()
    engine = engine_on(runner)
    Recorder(runner).skip_copies = True
    run(engine, PROMPT, "first")
    skipped = run(engine, PROMPT, "skipped")
    assert skipped[2] == len(PROMPT) - 1
    with pytest.raises(AssertionError):
        assert_same(skipped, cold["same"], atol)


@pytest.mark.parametrize("variant", ["llama", "mistral", "gemma3", "deepseek_v2"])
def test_repeated_and_partly_repeated_prompts_match_a_cold_run(variant: str) -> None:
    """mistral and gemma3 have sliding-window layers (window 8, shorter than the prompts), deepseek_v2
    is MLA (one latent K/V head)."""
    torch.set_num_threads(1)
    model_type, overrides = VARIANTS[variant]
    bundle = bundle_from_hf(tiny_hf_model(model_type, **overrides))
    check_reuse(lambda: torch_runner(bundle), torch_block_reader)


def test_a_prompt_repeated_after_a_one_token_reply_reuses_its_partly_filled_block() -> None:
    """22 tokens: 5 whole blocks and 2 tokens; a one-token reply never fills the last block, which is
    kept as a source all the same (the engine's keep_tails): the repeat computes 1 token."""
    torch.set_num_threads(1)
    bundle = bundle_from_hf(tiny_hf_model("llama"))
    prompt = PROMPT[:22]
    cold = run(engine_on(torch_runner(bundle)), prompt, "cold")
    runner = torch_runner(bundle)
    engine = engine_on(runner)
    recorder = Recorder(runner, torch_block_reader(runner))
    short = run(engine, prompt, "short", SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))
    assert short[0] == cold[0][:1]
    again = run(engine, prompt, "again")
    assert again[2] == len(prompt) - 1 and recorder.first_step_of("again")[1] == 1
    assert [c[2] for c in recorder.first_step_of("again")[0]] == [1]
    assert_same(again, cold)


@pytest.mark.parametrize("kv", ["int8", "bf16"])
def test_quantized_and_bf16_caches_copy_codes_and_scales(kv: str) -> None:
    """The copy is checked exact (codes and scales) by the recorder. Against the cold run the logprobs
    are held to QUANTIZED_ATOL only: a cold prefill attends over its own K/V unrounded, a reused prompt's
    last token over the stored, rounded ones (so do whole-block hits): 0.012 seen on int8, and the tiny
    model's near-ties then flip later greedy tokens, so only the first token's top 5 are compared."""
    torch.set_num_threads(1)
    bundle = bundle_from_hf(tiny_hf_model("llama"))
    check_reuse(lambda: torch_runner(bundle, kv), torch_block_reader, QUANTIZED_ATOL)


def test_mlx_runner_copies_too() -> None:
    pytest.importorskip("mlx.core")
    from tests.helpers.parity import mlx_runner

    def reader(runner: Any) -> Callable[[int, int], np.ndarray]:
        def read(block: int, k: int) -> np.ndarray:
            rows = slice(block * BLOCK, block * BLOCK + k)
            return np.concatenate([np.array(a[rows]).ravel() for c in runner.kv_caches for a in (c.k, c.v)])

        return read

    bundle = bundle_from_hf(tiny_hf_model("llama"))
    check_reuse(lambda: mlx_runner(bundle), reader)


def test_shared_prefixes_under_memory_pressure_match_running_alone() -> None:
    """Twelve requests on 6 prompts (three 40-token prefixes cut at different points), in a pool of
    32 blocks of 16: admissions copy from cached blocks while others are preempted and recomputed
    (their recomputation reuses what is cached, partly too); every reply equals the prompt run alone."""
    torch.set_num_threads(1)
    bundle = bundle_from_hf(tiny_hf_model("llama", head_dim=64))  # 32 KiB a block: 1 MiB = 32 blocks
    bases = [[int(t) for t in RNG.integers(3, 250, size=40)] for _ in range(3)]
    prompts = [b[:cut] + [int(t) for t in RNG.integers(3, 250, size=5)] for b in bases for cut in (37, 21)]
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    alone = []
    for p in prompts:
        engine = engine_on(torch_runner(bundle), block_size=16)
        engine.add_request(p, params)
        alone.append([t for out in drain(engine) for t in out.new_token_ids])
    runner = torch_runner(bundle)
    engine = engine_on(runner, block_size=16, kv_cache_mib=1)
    assert engine.block_manager.num_usable_blocks == 32
    recorder = Recorder(runner)
    replies: dict[str, list[int]] = {}
    for round_ in range(2):
        for i, p in enumerate(prompts):
            engine.add_request(p, params, req_id=f"{round_}-{i}")
    for out in drain(engine):
        replies.setdefault(out.req_id, []).extend(out.new_token_ids)
    assert engine.scheduler.num_preemptions > 0
    assert any(copies for copies, _ in recorder.steps)
    for round_ in range(2):
        assert [replies[f"{round_}-{i}"] for i in range(len(prompts))] == alone
    assert engine.block_manager.num_used_blocks == 0


def _tiny_llama() -> ModelBundle:
    """The TP worker's loader (a spawned rank reloads the model itself)."""
    return bundle_from_hf(tiny_hf_model("llama"))


@pytest.mark.slow  # spawns a gloo rank
def test_tp2_every_rank_copies_its_shard() -> None:
    """--tp 2 on gloo: the copies travel with the step's batch to the worker, which copies its own KV
    heads; a rank that skipped it would attend over a wrong block and move the all-reduced logits."""
    torch.set_num_threads(1)
    cold = run(engine_on(torch_runner(_tiny_llama())), PROMPT, "cold")
    options = RunnerOptions(device="cpu", dtype="float32", num_threads=1, tensor_parallel_size=2, seed=0)
    runner = ParallelRunner(_tiny_llama(), options, load=_tiny_llama)
    try:
        engine = engine_on(runner, kv_cache_mib=1)
        run(engine, PROMPT, "first")
        recorder = Recorder(runner)
        again = run(engine, PROMPT, "again")
        assert again[2] == len(PROMPT) - 1
        assert recorder.first_step_of("again")[1] == 1 and recorder.steps[0][0]
        assert_same(again, cold)
    finally:
        runner.shutdown()


def test_micro_batches_copy_with_their_first_group() -> None:
    """A pipeline stage that cuts a step runs the copies once, before its first group writes anything."""
    runner = torch_runner(_tiny_llama())
    driver = PagedDriver(runner, num_blocks=64, block_size=4)
    for req_id, size in (("a", 30), ("b", 30)):
        driver.add(req_id, [5 + i for i in range(size)])
    _, batch = driver.build()
    batch.kv_copies = [(40, 41, 3)]
    first, second = micro_batches(batch, 2, min_tokens=1)
    assert first.kv_copies == [(40, 41, 3)] and second.kv_copies == []


@pytest.mark.slow  # spawns a gloo rank
def test_pp2_every_stage_copies_its_layers() -> None:
    """--pp 2 on gloo, steps in flight: each stage copies its own layers' blocks."""
    torch.set_num_threads(1)
    cold = run(engine_on(torch_runner(_tiny_llama())), PROMPT, "cold")
    options = RunnerOptions(device="cpu", dtype="float32", num_threads=1, pipeline_parallel_size=2, seed=0)
    runner = ParallelRunner(_tiny_llama(), options, load=_tiny_llama)
    try:
        engine = engine_on(runner, kv_cache_mib=1)
        assert engine.in_flight is not None
        run(engine, PROMPT, "first")
        again = run(engine, PROMPT, "again")
        assert again[2] == len(PROMPT) - 1
        assert_same(again, cold)
    finally:
        runner.shutdown()
