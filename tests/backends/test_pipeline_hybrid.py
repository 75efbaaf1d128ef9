"""Hybrid-state models (recurrent / SSM state slots beside K/V) split into pipeline stages: each stage
keeps the state of its own layers in its own slot pool, the slots bound in step with the engine's
(the step's `state_slots` reach every stage), and a stage may hold no K/V layer at all. The same
greedy tokens and float32 logits as the whole model in one process, for a ragged batched prefill then
batched decode, and a chunked prefill with a preemption (the request gets a fresh slot and is
recomputed), under `--gpu-layers` (cpu/cpu, in process) and `--pp 2` (gloo, 2 processes)."""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any, cast

import numpy as np
import pytest
import torch

from localchat.backends import RunnerOptions
from localchat.backends.torch.parallel.device_split import SplitRunner, split_runner
from localchat.backends.torch.parallel.driver import ParallelRunner
from localchat.backends.torch.parallel.stages import StageCosts, StageRunner, shared_budget, whole_model_specs
from localchat.backends.torch.runner import TorchRunner
from localchat.engine.interface import KVCacheSpec
from localchat.weights.bundle import ModelBundle
from tests.backends.test_qwen3_next import HybridDriver
from tests.helpers.torch_models import bundle_from_hf, exact_weights, fp32_runner

PROMPTS = {"a": [5, 9, 17, 33, 64, 2, 100, 7, 81], "b": [7, 8, 9], "c": list(range(40, 110))}
DECODE_STEPS = 4
SLOTS = 4  # HybridDriver's slot pool
PP2 = RunnerOptions(device="cpu", dtype="float32", num_threads=1, pipeline_parallel_size=2)


def hybrid_bundle(kind: str) -> ModelBundle:
    """Also the workers' loader (seeded, so every process builds the same weights).
    - qwen3_5: [linear, linear, linear, full]: stage 0 of 2 keeps state only, no K/V;
    - nemotron_h: [mamba, mlp, attention, mlp, mamba, mlp]: stage 1 of 2 keeps no K/V;
    - lfm2: [conv, attention, conv, attention]."""
    if kind == "qwen3_5":
        from tests.backends.test_qwen3_next import tiny_qwen3_5

        return bundle_from_hf(tiny_qwen3_5(full_attention_interval=4))
    if kind == "nemotron_h":
        from tests.backends.test_nemotron_h import tiny_nemotron_h

        return bundle_from_hf(tiny_nemotron_h())
    from transformers import Lfm2Config, Lfm2ForCausalLM

    from tests.backends.test_lfm2 import TINY

    torch.manual_seed(0)
    model = Lfm2ForCausalLM(Lfm2Config(**cast(dict[str, Any], TINY))).float().eval()
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(0.25 * torch.randn_like(param))
    return bundle_from_hf(model)


def ragged_then_decode(runner: TorchRunner) -> tuple[list[torch.Tensor], dict[str, list[int]]]:
    """All prompts prefilled in one batch (70 tokens take two DeltaNet chunks), then greedy decode."""
    runner.initialize_state_cache(SLOTS)
    driver = HybridDriver(runner)
    for req_id, prompt in PROMPTS.items():
        driver.add(req_id, prompt)
    steps = []
    for _ in range(DECODE_STEPS + 1):
        req_ids, logits = driver.step_logits()
        steps.append(logits.cpu())
        for req_id, row in zip(req_ids, logits, strict=True):
            driver.feed(req_id, int(row.argmax()))
    return steps, {r: driver.tokens(r)[len(p) :] for r, p in PROMPTS.items()}


def chunked_and_preempted(runner: TorchRunner) -> dict[str, list[int]]:
    """execute_model's sampling: a prompt prefilled in two chunks (the state carried between them)
    beside a short one, then the short one preempted: a fresh slot, zeroed on every stage, recomputed."""
    runner.initialize_state_cache(SLOTS)
    driver = HybridDriver(runner)
    driver.add("a", PROMPTS["c"])
    driver.add("b", PROMPTS["a"])
    driver.step({"a": 30, "b": 9})
    driver.step({"a": 40, "b": 1})
    driver.preempt("b")
    for _ in range(3):
        driver.step()
    return {r: driver.tokens(r) for r in ("a", "b")}


def expected(bundle: ModelBundle) -> tuple[list[torch.Tensor], dict[str, list[int]], dict[str, list[int]]]:
    reference = fp32_runner(bundle)
    logits, tokens = ragged_then_decode(reference)
    return logits, tokens, chunked_and_preempted(reference)


def assert_same(runner: TorchRunner, bundle: ModelBundle) -> None:
    want_logits, want_tokens, want_chunked = expected(bundle)
    logits, tokens = ragged_then_decode(runner)
    assert tokens == want_tokens
    for ours, ref in zip(logits, want_logits, strict=True):
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    assert chunked_and_preempted(runner) == want_chunked


@pytest.mark.parametrize("kind", ["qwen3_5", "nemotron_h", "lfm2"])
def test_gpu_layers_split_of_a_hybrid_matches_one_device(kind: str) -> None:
    """`--gpu-layers` wired cpu/cpu: each stage's state pool holds its own layers' slots."""
    torch.set_num_threads(1)
    bundle = hybrid_bundle(kind)
    layers = bundle.config.num_hidden_layers
    options = RunnerOptions(device="cpu", dtype="float32", num_threads=1, gpu_layers=layers // 2)
    with exact_weights():
        runner = split_runner(bundle, options, devices=("cpu", "cpu"))
    assert isinstance(runner, SplitRunner)
    whole = fp32_runner(bundle)
    state = runner.state_cache_spec
    assert state is not None and state == whole.state_cache_spec  # every stage's state layers
    assert runner.kv_cache_spec == whole.kv_cache_spec
    costs = [s.stage_costs() for s in runner.stages]
    assert sum(c.state_layers for c in costs) == state.num_layers and all(
        c.kv_layers + c.state_layers for c in costs
    )
    assert_same(cast(TorchRunner, runner), bundle)
    pools = [cast(Any, stage.model).states for stage in runner.stages]
    assert sum(len(pool.conv) for pool in pools) == state.num_layers


def test_a_stage_without_kv_layers() -> None:
    """Qwen3.5 [linear x3, full] with --gpu-layers 1: the CPU stage is three DeltaNet layers (state
    slots, no K/V), the other one full-attention layer (K/V, no state)."""
    torch.set_num_threads(1)
    bundle = hybrid_bundle("qwen3_5")
    options = RunnerOptions(device="cpu", dtype="float32", num_threads=1, gpu_layers=1)
    with exact_weights():
        runner = split_runner(bundle, options, devices=("cpu", "cpu"))
    assert isinstance(runner, SplitRunner)
    first, last = runner.stages
    assert first.stage_costs().kv_layers == 0 and last.stage_costs().state_layers == 0
    assert_same(cast(TorchRunner, runner), bundle)
    assert first.kv_caches == [] and len(last.kv_caches) == 1


def test_the_budget_holds_on_the_tightest_pool() -> None:
    """Pool A holds 3/4 of the K/V and 1/4 of the state, pool B the rest: whatever the engine buys with
    the budget (slots and tokens), each pool's part of it fits its own budget."""
    kv = KVCacheSpec(4, 2, 16, 4)  # 4 layers' K/V: 512 bytes a token
    a, b = StageCosts(3, 384, 1, 1000), StageCosts(1, 128, 3, 3000)
    whole_kv, state = whole_model_specs(kv.__class__(1, 2, 16, 4), a + b)
    assert whole_kv == kv and state is not None and state.bytes_per_slot == 4000
    budget = shared_budget([(10_000_000, a), (4_000_000, b)], whole_kv, state)
    assert budget is not None
    for slots in (0, 5, 100):
        tokens = (budget - slots * 4000) // 512
        for pool_budget, c in ((10_000_000, a), (4_000_000, b)):
            assert slots * c.state_bytes_per_slot + tokens * c.kv_bytes_per_token <= pool_budget
    assert shared_budget([(None, a), (1000, StageCosts(0, 0, 0, 0))], whole_kv, state) is None


def test_a_hybrid_split_through_the_engine() -> None:
    """The engine on the split runner and on PP=2: one slot pool sized from both stages' state,
    chunked prefills and batched decode give the one-device engine's greedy tokens."""
    from localchat.backends.fake import FakeTokenizer
    from localchat.engine.config import EngineConfig
    from localchat.engine.engine import LLMEngine
    from tests.backends.test_runner_invariance import generate

    torch.set_num_threads(1)
    bundle = hybrid_bundle("nemotron_h")
    config = EngineConfig(max_num_seqs=4, max_num_batched_tokens=128, prefill_chunk_size=16)
    prompts = [[5 + i for i in range(21)], [7, 8, 9], [5 + i for i in range(18)] + [200], [40] * 6]
    options = RunnerOptions(device="cpu", dtype="float32", num_threads=1)
    with exact_weights():
        plain = TorchRunner(bundle, options)
        split = split_runner(bundle, replace(options, gpu_layers=3), devices=("cpu", "cpu"))
    tokenizer = FakeTokenizer()
    want = generate(LLMEngine(plain, tokenizer, config, eos_token_ids=[2], model_max_len=256), prompts, 6)
    engine = LLMEngine(split, tokenizer, config, eos_token_ids=[2], model_max_len=256)
    assert engine.state_pool is not None
    assert generate(engine, prompts, 6) == want
    # --pp 2: the engine on rank 0 sizes the slot pool from both ranks' state; rank 1 allocates its own.
    with exact_weights():
        ranks = ParallelRunner(bundle, PP2, load=functools.partial(hybrid_bundle, "nemotron_h"))
    try:
        engine = LLMEngine(cast(Any, ranks), tokenizer, config, eos_token_ids=[2], model_max_len=256)
        whole_state = plain.state_cache_spec
        assert whole_state is not None and engine.state_pool is not None
        assert engine.state_bytes_per_slot == whole_state.bytes_per_slot
        assert generate(engine, prompts, 6) == want
    finally:
        ranks.shutdown()


@pytest.mark.parametrize("kind", ["qwen3_5", "nemotron_h"])
@pytest.mark.slow  # spawns gloo ranks: out of the fast tier, still in CI
def test_pp2_of_a_hybrid_matches_one_device(kind: str) -> None:
    """`--pp 2` over gloo: rank 1 (a spawned worker) holds the last stage and its own state pool; the
    slots and the zeroing of fresh ones reach it with every step."""
    torch.set_num_threads(1)
    bundle = hybrid_bundle(kind)
    with exact_weights():
        runner = ParallelRunner(bundle, PP2, load=functools.partial(hybrid_bundle, kind))
    try:
        stage = cast(StageRunner, runner.runner)
        whole = fp32_runner(bundle)
        assert runner.state_cache_spec == whole.state_cache_spec  # the whole model's, from both ranks
        assert runner.kv_cache_spec == whole.kv_cache_spec
        assert stage.own_kv_spec().num_layers == (0 if kind == "qwen3_5" else 1)
        assert_same(cast(TorchRunner, runner), bundle)
        assert np.isfinite(runner.available_kv_memory() or 0)
    finally:
        runner.shutdown()
