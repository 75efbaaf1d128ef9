"""Families that run their own layer loop, split into pipeline stages: Gemma 2 / 3 (sliding-window and
global layers, a RoPE base per kind, soft-capped logits), Gemma 4 (per-kind head sizes and RoPE tables,
its K/V cache indices re-made per stage), SmolLM3 and Llama 4 (NoPE layers), Ministral 3 (per-token q
temperature). The same greedy tokens and float32 logits as one device (ragged batched prefill then
decode, chunked prefill with a preemption; prompts longer than the 8-token window) under
`--gpu-layers` (cpu/cpu) and `--pp 2` (gloo); a split through K/V sharing is refused up front."""

from __future__ import annotations

import functools
from typing import Any, cast

import pytest
import torch

from localchat.backends import RunnerOptions
from localchat.backends.torch.parallel.device_split import SplitRunner, split_runner
from localchat.backends.torch.parallel.driver import ParallelRunner
from localchat.backends.torch.parallel.pipeline import check_pipeline
from localchat.backends.torch.parallel.stages import StageRunner
from localchat.backends.torch.runner import TorchRunner
from localchat.errors import BackendUnavailableError
from localchat.weights.bundle import ModelBundle
from tests.backends.test_pipeline_parallel import PP2, chunked_and_preempted, ragged_then_decode
from tests.helpers.torch_models import VARIANTS, bundle_from_hf, exact_weights, fp32_runner, tiny_hf_model

SLIDING, FULL = "sliding_attention", "full_attention"


def loop_bundle(name: str) -> ModelBundle:
    """3 or 4 layers, sliding and global ones on both sides of the split. Also the workers' loader."""
    if name.startswith("gemma4"):
        from tests.backends.test_gemma4 import VARIANTS as GEMMA4
        from tests.backends.test_gemma4 import tiny_gemma4

        return bundle_from_hf(tiny_gemma4(**GEMMA4[name]))
    if name.startswith("smollm3"):
        from tests.backends.test_smollm3 import VARIANTS as SMOLLM3

        return bundle_from_hf(tiny_hf_model("smollm3", **cast(dict[str, Any], SMOLLM3[name])))
    if name.startswith("llama4"):
        from tests.backends.test_llama4 import VARIANTS as LLAMA4

        return bundle_from_hf(tiny_hf_model("llama4_text", **LLAMA4[name]))
    model_type, overrides = VARIANTS[name]
    extra: dict[str, Any] = {"num_hidden_layers": 3}
    if name == "gemma3":
        extra["layer_types"] = [SLIDING, FULL, SLIDING]
    return bundle_from_hf(tiny_hf_model(model_type, **{**overrides, **extra}))


def assert_same(runner: TorchRunner, bundle: ModelBundle) -> None:
    reference = fp32_runner(bundle)
    want_logits, want_tokens = ragged_then_decode(reference)
    want_chunked = chunked_and_preempted(reference)
    logits, tokens = ragged_then_decode(runner)
    assert tokens == want_tokens
    for ours, ref in zip(logits, want_logits, strict=True):
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    assert chunked_and_preempted(runner) == want_chunked


NAMES = ["gemma2", "gemma3", "gemma4", "gemma4-moe", "smollm3-sliding", "llama4", "ministral3"]


@pytest.mark.parametrize("name", NAMES)
def test_gpu_layers_split_of_an_own_loop_matches_one_device(name: str) -> None:
    torch.set_num_threads(1)
    bundle = loop_bundle(name)
    layers = bundle.config.num_hidden_layers
    options = RunnerOptions(device="cpu", dtype="float32", num_threads=1, gpu_layers=layers // 2)
    with exact_weights():
        runner = split_runner(bundle, options, devices=("cpu", "cpu"))
    assert isinstance(runner, SplitRunner)
    assert runner.kv_cache_spec == fp32_runner(bundle).kv_cache_spec
    assert_same(cast(TorchRunner, runner), bundle)


def test_gemma4_stages_index_their_own_caches() -> None:
    """[sliding, full | sliding, full]: each stage's loop reads its layers' kinds (16- and 32-wide
    heads, two RoPE tables) and caches 0 and 1 of its own pool."""
    bundle = loop_bundle("gemma4")
    options = RunnerOptions(device="cpu", dtype="float32", num_threads=1, gpu_layers=2)
    runner = split_runner(bundle, options, devices=("cpu", "cpu"))
    assert isinstance(runner, SplitRunner)
    for stage in runner.stages:
        model = cast(Any, stage.model)
        assert model.config.extra["layer_types"] == [SLIDING, FULL] and model.cache_index == [0, 1]


@pytest.mark.parametrize("name", ["gemma3", "gemma4"])
@pytest.mark.slow  # spawns gloo ranks: out of the fast tier, still in CI
def test_pp2_of_an_own_loop_matches_one_device(name: str) -> None:
    torch.set_num_threads(1)
    bundle = loop_bundle(name)
    with exact_weights():
        runner = ParallelRunner(bundle, PP2, load=functools.partial(loop_bundle, name))
    try:
        assert len(cast(StageRunner, runner.runner).model.layers) == 2
        assert_same(cast(TorchRunner, runner), bundle)
    finally:
        runner.shutdown()


def test_what_the_split_cannot_carry_is_refused() -> None:
    """K/V shared across every possible boundary (layers 2 and 3 reuse layers 0 and 1's K/V): no split
    keeps them together (test_pipeline_gemma4_ple.py: the E2B-shaped splits that work)."""
    shared = loop_bundle("gemma4-k-eq-v-shared")
    with pytest.raises(BackendUnavailableError, match=r"layers 0-3 must share a stage .* cannot be split"):
        check_pipeline(shared.config, 2)
    options = RunnerOptions(device="cpu", dtype="float32", num_threads=1, gpu_layers=1)
    with pytest.raises(BackendUnavailableError, match=r"--gpu-layers 1: Gemma 4 layer 3 reuses .* layer 1"):
        split_runner(shared, options, devices=("cpu", "cpu"))
