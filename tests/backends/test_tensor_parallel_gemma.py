"""Gemma 2 / 3 under tensor parallelism (shard_gemma.py), alone and inside pipeline stages (TP x PP):
tiny random models (sliding and global layers with an 8-token window shorter than the prompts; Gemma 2's
attention and final soft-caps, Gemma 3's q/k norms and second RoPE base). TP=2 (gloo, 2 processes) and
TP=2 x PP=2 (4 processes) give one device's greedy tokens and float32 logits within 1e-4, ragged then
decode, and chunked with a preemption (tests/helpers/tp_parity.py)."""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any

import pytest

from localchat.backends.torch.parallel.shard import check_supported
from localchat.errors import BackendUnavailableError
from tests.backends.test_pipeline_gemma import loop_bundle
from tests.helpers.tp_parity import TP2, TP2_PP2, assert_tp_parity


@pytest.mark.parametrize("name", ["gemma2", "gemma3"])
@pytest.mark.slow  # spawns gloo ranks: out of the fast tier, still in CI
def test_tp2_matches_one_device(name: str) -> None:
    def check(local: Any) -> None:
        layer = local.model.layers[0]
        assert (layer.heads, layer.kv_heads) == (2, 1)  # 2 of 4 q heads, 1 of 2 KV heads

    assert_tp_parity(functools.partial(loop_bundle, name), TP2, check)


@pytest.mark.slow  # spawns 4 gloo ranks
def test_tp2_by_pp2_matches_one_device() -> None:
    """Gemma 3 [sliding, full | sliding]: ranks 0-1 shard layers 0-1, ranks 2-3 layer 2 and the head."""

    def check(stage: Any) -> None:
        assert list(stage.plan.layers) == [0, 1] and stage.model.layers[0].heads == 2

    assert_tp_parity(functools.partial(loop_bundle, "gemma3"), TP2_PP2, check)


def test_gemma4_and_the_other_hybrids_are_pointed_at_pp() -> None:
    """Sharded: Gemma 3, the MoE Qwen3.5 / Qwen3-Next, a Mamba-2 GGUF (test_tensor_parallel_hybrid_gguf.py)
    and the MoE Gemma 4; every family is now (test_tensor_parallel.py takes one off the list to see the
    refusal), so what still points at --pp is a size that does not split the heads."""
    from tests.backends.test_pipeline_hybrid import hybrid_bundle

    check_supported(loop_bundle("gemma3").config, 2)
    nemotron = hybrid_bundle("nemotron_h").config
    check_supported(nemotron, 2)
    check_supported(replace(nemotron, extra={**nemotron.extra, "gguf_ssm_inner_size": 64}), 2)
    qwen3_5 = hybrid_bundle("qwen3_5").config
    check_supported(qwen3_5, 2)
    check_supported(replace(qwen3_5, extra={**qwen3_5.extra, "num_experts": 4}), 2)
    moe = loop_bundle("gemma4-moe").config
    check_supported(moe, 2)
    with pytest.raises(BackendUnavailableError, match=r"work for it: 1, 2, 4.*--pipeline-parallel-size 3"):
        check_supported(moe, 3)
