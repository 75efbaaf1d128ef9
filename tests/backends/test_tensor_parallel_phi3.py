"""Phi-3 / Phi-4-mini under tensor parallelism: Llama's layer on the checkpoint's fused tensors, so each
rank takes its q rows and its KV heads' k and v rows out of qkv_proj, and its rows of each half of
gate_up_proj (shard_weights.py). Tiny random models, full rotary (Phi-3) and 3/4 rotary (Phi-4-mini).
TP=2 (gloo, 2 processes), and TP=2 x PP=2 (4), give one device's greedy tokens and float32 logits
within 1e-4: ragged batched prefill then decode, and a chunked prefill with a preemption."""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any, cast

import pytest
import torch

from localchat.backends import RunnerOptions
from localchat.backends.torch.parallel.driver import ParallelRunner
from localchat.backends.torch.runner import TorchRunner
from localchat.weights.bundle import ModelBundle
from tests.backends.test_pipeline_parallel import PP2, chunked_and_preempted, ragged_then_decode
from tests.helpers.torch_models import bundle_from_hf, exact_weights, fp32_runner, tiny_hf_model

TP2 = RunnerOptions(device="cpu", dtype="float32", num_threads=1, tensor_parallel_size=2)


def phi3_bundle(rotary: float) -> ModelBundle:
    """Seeded: also the workers' loader. 4 heads of 16, 2 KV heads, MLP 128 wide."""
    return bundle_from_hf(tiny_hf_model("phi3", vocab_size=255, partial_rotary_factor=rotary))


@pytest.mark.slow  # spawns gloo ranks
@pytest.mark.parametrize(
    ("rotary", "options"),
    [(1.0, TP2), (0.75, TP2), (0.75, replace(PP2, tensor_parallel_size=2))],
    ids=["phi3-tp2", "phi4-mini-tp2", "phi4-mini-tp2xpp2"],
)
def test_phi3_tp2_matches_one_device(rotary: float, options: RunnerOptions) -> None:
    torch.set_num_threads(1)
    load = functools.partial(phi3_bundle, rotary)
    reference = fp32_runner(load())
    want_logits, want_tokens = ragged_then_decode(reference)
    want_chunked = chunked_and_preempted(reference)
    with exact_weights():
        runner = ParallelRunner(load(), options, load=load)
    try:
        layer = cast(Any, runner.runner).model.layers[0]
        assert (layer.heads, layer.kv_heads) == (2, 1)
        assert tuple(layer.qkv.shape) == ((2 + 2 * 1) * 16, 64) and tuple(layer.down.shape) == (64, 64)
        logits, tokens = ragged_then_decode(cast(TorchRunner, runner))
        assert tokens == want_tokens
        for ours, ref in zip(logits, want_logits, strict=True):
            torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)
        assert chunked_and_preempted(cast(TorchRunner, runner)) == want_chunked
    finally:
        runner.shutdown()
