"""Pipeline parallelism on gloo with 2 CPU processes, and the one-process CPU + GPU layer split run as
cpu/cpu: the same greedy tokens (and float32 logits) as the whole model on one device, through the
real step path: a batched ragged prefill then batched decode, and a chunked prefill with a preemption
(the preempted request recomputed from scratch on its way back)."""

from __future__ import annotations

import functools
import time
from dataclasses import replace
from typing import cast

import pytest
import torch

from localchat.backends import RunnerOptions
from localchat.backends.torch.entry import create_runner
from localchat.backends.torch.parallel.device_split import SplitRunner, split_runner
from localchat.backends.torch.parallel.driver import ParallelRunner
from localchat.backends.torch.parallel.layer_split import split_layers
from localchat.backends.torch.parallel.pipeline import check_pipeline
from localchat.backends.torch.parallel.shard import check_supported
from localchat.backends.torch.parallel.stages import StageRunner
from localchat.backends.torch.runner import TorchRunner
from localchat.errors import BackendUnavailableError
from localchat.weights.bundle import ModelBundle
from tests.helpers.torch_batch import PagedDriver
from tests.helpers.torch_models import VARIANTS, bundle_from_hf, exact_weights, fp32_runner, tiny_hf_model

PROMPTS = {"a": [5, 9, 17, 33, 64, 2, 100], "b": [7, 8, 9], "c": list(range(40, 61))}
DECODE_STEPS = 4
EXACT = RunnerOptions(device="cpu", dtype="float32", num_threads=1)
PP2 = RunnerOptions(device="cpu", dtype="float32", num_threads=1, pipeline_parallel_size=2)

# Every family --tp shards, a tied LM head (the last stage loads the embedding as its head), and
# DeepSeek-V2 (MLA attention; layer 0 dense, the others MoE). Shapes: VARIANTS.
FAMILIES = ["llama", "llama-tied", "mistral", "qwen2", "qwen3", "mixtral", "qwen3_moe", "deepseek_v2"]


def family_bundle(family: str) -> ModelBundle:
    """The workers' loader too (a real server's workers reload the model from its path). 3 layers: an
    uneven split (stage 0 takes 2, stage 1 takes 1)."""
    if family == "llama-tied":
        model_type, overrides = "llama", {"tie_word_embeddings": True}
    else:
        model_type, overrides = VARIANTS.get(family, (family, {}))
    return bundle_from_hf(tiny_hf_model(model_type, **{**overrides, "num_hidden_layers": 3}))


def ragged_then_decode(runner: TorchRunner) -> tuple[list[torch.Tensor], dict[str, list[int]]]:
    """Prefill all prompts in one batch, then decode greedily; the logits of every step."""
    driver = PagedDriver(runner, num_blocks=32, block_size=4)
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
    """execute_model's sampling: a prompt prefilled in two chunks beside a short one, then the short
    one preempted (its KV dropped) and recomputed while the other decodes."""
    driver = PagedDriver(runner, num_blocks=32, block_size=4)
    driver.add("a", PROMPTS["c"])
    driver.add("b", PROMPTS["a"])
    driver.step({"a": 9, "b": 7})  # a's first chunk; b whole (it samples)
    driver.step({"a": 12, "b": 1})  # a's rest (it samples); b decodes
    driver.preempt("b")
    for _ in range(3):
        driver.step()  # b comes back as new: its prompt and tokens so far, recomputed
    return {r: driver.tokens(r) for r in ("a", "b")}


def test_layers_split_contiguously_balanced_by_count() -> None:
    assert split_layers(30, 2) == [range(0, 15), range(15, 30)]
    assert split_layers(9, 4) == [range(0, 3), range(3, 5), range(5, 7), range(7, 9)]


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.slow  # spawns gloo ranks: out of the fast tier, still in CI
def test_pp2_matches_one_device(family: str) -> None:
    """`--pp 2`: a spawned worker holds the last stage; rank 0 (here) the first. Logits within 1e-5
    and greedy tokens equal to the whole model in one process, for ragged, chunked and preempted steps."""
    torch.set_num_threads(1)
    bundle = family_bundle(family)
    reference = fp32_runner(bundle)
    expected_logits, expected_tokens = ragged_then_decode(reference)
    expected_chunked = chunked_and_preempted(reference)
    with exact_weights():
        runner = ParallelRunner(bundle, PP2, load=functools.partial(family_bundle, family))
    try:
        stage = cast(StageRunner, runner.runner)
        assert list(stage.plan.layers) == [0, 1] and len(stage.model.layers) == 2
        logits, tokens = ragged_then_decode(cast(TorchRunner, runner))
        assert len(stage.kv_caches) == 2  # rank 0's pool: its 2 layers of 3
        assert stage.model.lm_head is None or stage.model.lm_head.numel() == 0
        assert tokens == expected_tokens
        for ours, ref in zip(logits, expected_logits, strict=True):
            torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
        assert chunked_and_preempted(cast(TorchRunner, runner)) == expected_chunked
    finally:
        runner.shutdown()


@pytest.mark.slow  # spawns gloo ranks: out of the fast tier, still in CI
def test_a_killed_pipeline_worker_is_reported() -> None:
    """The tensor-parallel watchdog covers pipeline workers: seen within seconds, then an error."""
    runner = ParallelRunner(family_bundle("llama"), PP2, load=functools.partial(family_bundle, "llama"))
    try:
        assert runner.context is not None
        worker = runner.context.processes[0]
        worker.kill()
        worker.join(timeout=10)
        deadline = time.monotonic() + 5
        while runner.failure is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert runner.failure is not None and "pipeline-parallel worker rank 1 died" in runner.failure
        with pytest.raises(BackendUnavailableError, match="worker rank 1 died"):
            runner.initialize_kv_cache(8, 4)
    finally:
        runner.shutdown()


# Beyond the PP families: Phi-3, GLM-4 MoE and DeepSeek-V3 (in-process, so cheap to cover).
@pytest.mark.parametrize("family", ["llama", "llama-tied", "qwen3_moe", "phi3", "glm4_moe", "deepseek_v3"])
def test_cpu_gpu_split_wiring_matches_one_device(family: str) -> None:
    """`--gpu-layers 1` with the device pair given as cpu/cpu: two stages in one process, the handoff
    between them, each stage's own KV pool; the same logits and tokens as the whole model."""
    torch.set_num_threads(1)
    bundle = family_bundle(family)
    reference = fp32_runner(bundle)
    expected_logits, expected_tokens = ragged_then_decode(reference)
    expected_chunked = chunked_and_preempted(reference)
    options = RunnerOptions(device="cpu", dtype="float32", num_threads=1, gpu_layers=1)
    with exact_weights():
        runner = split_runner(bundle, options, devices=("cpu", "cpu"))
    assert isinstance(runner, SplitRunner)
    first, last = runner.stages
    assert (list(first.plan.layers), list(last.plan.layers)) == ([0, 1], [2])
    assert runner.kv_cache_spec.num_layers == 3
    logits, tokens = ragged_then_decode(cast(TorchRunner, runner))
    assert (len(first.kv_caches), len(last.kv_caches)) == (2, 1)
    assert tokens == expected_tokens
    for ours, ref in zip(logits, expected_logits, strict=True):
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    assert chunked_and_preempted(cast(TorchRunner, runner)) == expected_chunked


def test_gpu_layers_without_a_gpu_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    options = RunnerOptions(gpu_layers=1)
    with pytest.raises(BackendUnavailableError, match=r"--gpu-layers needs a CUDA GPU, and torch sees none"):
        create_runner(family_bundle("llama"), options)
    with pytest.raises(BackendUnavailableError, match="--device is 'cpu'"):
        create_runner(family_bundle("llama"), RunnerOptions(device="cpu", gpu_layers=1))
    with pytest.raises(BackendUnavailableError, match="does not combine with --tensor-parallel-size"):
        create_runner(family_bundle("llama"), RunnerOptions(gpu_layers=1, pipeline_parallel_size=2))


def test_the_kv_budget_is_the_tighter_devices_in_tokens() -> None:
    """Two CPU stages share the RAM budget: the pool is what one budget holds of all 3 layers' K/V."""
    options = RunnerOptions(device="cpu", dtype="float32", num_threads=1, gpu_layers=1)
    runner = split_runner(family_bundle("llama"), options, devices=("cpu", "cpu"))
    assert isinstance(runner, SplitRunner)
    budget = runner.stages[0].available_kv_memory()
    assert budget is not None
    per_token = runner.kv_cache_spec.bytes_per_block(1)
    assert runner.available_kv_memory() == budget // per_token * per_token


def test_refusals_say_what_to_change() -> None:
    with pytest.raises(BackendUnavailableError, match="at least one layer per stage; this model has 3"):
        check_pipeline(family_bundle("llama").config, 4)
    check_pipeline(bundle_from_hf(tiny_hf_model("gemma2")).config, 2)  # its own loop: staged too now


def test_tp_sizes_that_do_not_split_the_heads_name_pp_as_the_fix() -> None:
    """3 ranks cannot split 4 heads; 3 stages can split the layers."""
    config = family_bundle("llama").config
    with pytest.raises(BackendUnavailableError, match=r"work for it: 1, 2, 4\. .*--pipeline-parallel-size 3"):
        check_supported(config, 3)
    check_pipeline(config, 3)  # accepted
    deepseek = family_bundle("deepseek_v2").config  # once refused under --tp; MLA is cut by head now
    check_supported(deepseek, 2)
    check_pipeline(deepseek, 2)


def test_cpu_gpu_split_through_the_engine() -> None:
    """The engine on the split runner (cpu/cpu): KV sized from the stages' budgets, chunked prefills,
    prefix-cache hits and batched decode give the one-device engine's greedy tokens."""
    from localchat.backends.fake import FakeTokenizer
    from localchat.engine.config import EngineConfig
    from localchat.engine.engine import LLMEngine
    from tests.backends.test_runner_invariance import generate

    bundle = family_bundle("qwen3")
    config = EngineConfig(max_num_seqs=4, max_num_batched_tokens=128, prefill_chunk_size=16)
    prompts = [[5 + i for i in range(21)], [7, 8, 9], [5 + i for i in range(18)] + [200], [40] * 6]
    with exact_weights():
        plain = create_runner(bundle, EXACT)
        split = split_runner(bundle, replace(EXACT, gpu_layers=2), devices=("cpu", "cpu"))
    tokenizer = FakeTokenizer()
    expected = generate(LLMEngine(plain, tokenizer, config, eos_token_ids=[2], model_max_len=256), prompts, 6)
    engine = LLMEngine(split, tokenizer, config, eos_token_ids=[2], model_max_len=256)
    assert generate(engine, prompts, 6) == expected
    assert "layers 0-0 on cpu" in split.device_name and "layers 1-2 on cpu" in split.device_name


def test_a_stage_too_big_for_its_gpu_says_what_to_change() -> None:
    """The per-stage estimate (run on CUDA stages before loading), with the free memory given: a
    Llama-3-8B shape in 16 GiB splits into stages whose weights sum to the file, each with K/V for its
    16 layers only (half the per-token K/V of the whole model)."""
    from localchat.backends.torch.parallel.memory import check_stage_bytes, stage_bytes
    from localchat.weights.config import ModelConfig

    config = ModelConfig.from_hf_dict(
        {
            "model_type": "llama",
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "vocab_size": 128256,
        }
    )
    gib = 2**30
    first = stage_bytes(config, range(0, 16), True, False, 16 * gib)
    last = stage_bytes(config, range(16, 32), False, True, 16 * gib)
    # the embedding and the head weigh the same
    assert abs(first.weights + last.weights - 16 * gib) < 2**20 and first.weights == last.weights
    assert first.kv_per_token == last.kv_per_token == 16 * 2 * 8 * 128 * 2  # its layers' K and V, 2 bytes
    assert first.state_per_slot == 0
    check_stage_bytes(
        config, 1, range(16, 32), True, "cuda:1", "--pipeline-parallel-size 2", 16 * gib, 10 * gib
    )
    with pytest.raises(
        BackendUnavailableError,
        match=r"stage 1 \(layers 16-31\) needs about 8\.9 GiB \(8\.0 GiB of weights \+ K/V for 2048 tokens\) "
        r"but cuda:1 has 6\.0 GiB free\. Use more stages",
    ):
        check_stage_bytes(
            config, 1, range(16, 32), True, "cuda:1", "--pipeline-parallel-size 2", 16 * gib, 6 * gib
        )


@pytest.mark.slow  # spawns gloo ranks: out of the fast tier, still in CI
def test_pp3_passes_through_a_middle_stage() -> None:
    """3 stages of one layer each: rank 1 receives from rank 0 and sends to rank 2, which samples."""
    torch.set_num_threads(1)
    reference = fp32_runner(family_bundle("qwen3"))
    expected = chunked_and_preempted(reference)
    options = replace(PP2, pipeline_parallel_size=3)
    with exact_weights():
        runner = ParallelRunner(
            family_bundle("qwen3"), options, load=functools.partial(family_bundle, "qwen3")
        )
    try:
        assert list(cast(StageRunner, runner.runner).plan.layers) == [0]
        assert chunked_and_preempted(cast(TorchRunner, runner)) == expected
    finally:
        runner.shutdown()


@pytest.mark.parametrize("family", ["llama", "qwen3_moe"])
@pytest.mark.slow  # spawns gloo ranks: out of the fast tier, still in CI
def test_tp2_by_pp2_in_four_processes(family: str) -> None:
    """TP x PP: ranks 0-1 hold layers 0-1, ranks 2-3 layer 2, each pair splitting its stage's heads,
    MLP (experts) and vocab; hidden states go rank 0 -> 2 and 1 -> 3; logits and tokens as one device."""
    torch.set_num_threads(1)
    bundle = family_bundle(family)
    reference = fp32_runner(bundle)
    expected_logits, expected_tokens = ragged_then_decode(reference)
    expected_chunked = chunked_and_preempted(reference)
    options = replace(PP2, tensor_parallel_size=2)
    with exact_weights():
        runner = ParallelRunner(bundle, options, load=functools.partial(family_bundle, family))
    try:
        stage = cast(StageRunner, runner.runner)
        assert list(stage.plan.layers) == [0, 1] and stage.model.layers[0].heads == 2  # 2 of 4 heads
        logits, tokens = ragged_then_decode(cast(TorchRunner, runner))
        assert tokens == expected_tokens
        for ours, ref in zip(logits, expected_logits, strict=True):
            assert ours.shape == ref.shape
            torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)
        assert chunked_and_preempted(cast(TorchRunner, runner)) == expected_chunked
    finally:
        runner.shutdown()
