"""Hybrid-state models under tensor parallelism, alone and inside pipeline stages: LFM2 (short conv +
attention: conv layers cut by channel, each rank's in_proj rows, conv taps and state window for its
channels, out_proj's matching columns) and Nemotron-H (Mamba-2 + attention + relu² MLP blocks: each
mixer cut by SSM group and the heads reading it); attention and MLPs as Llama's. TP=2 (gloo, 2
processes) and TP=2 x PP=2 (4) give one device's greedy tokens and float32 logits within 1e-4, ragged
batched prefill then decode (a 70-token prompt: two scan chunks), and a chunked prefill with a
preemption (the state carried between chunks; a fresh slot zeroed on every rank): tests/helpers/tp_parity.py."""

from __future__ import annotations

import functools
from typing import Any, cast

import pytest
import torch

from localchat.weights.bundle import ModelBundle
from tests.backends.test_pipeline_hybrid import hybrid_bundle
from tests.helpers.torch_models import bundle_from_hf, fp32_runner
from tests.helpers.tp_parity import TP2, TP2_PP2, assert_tp_parity


def granite_bundle() -> ModelBundle:
    """Granite 4.0-H (tests/backends/test_granitemoehybrid.py's tiny one): Mamba-2 and attention
    mixers, each followed by a shared SwiGLU plus a 4-expert MoE; embedding, residual and logit scales."""
    from tests.backends.test_granitemoehybrid import tiny_granite

    return bundle_from_hf(tiny_granite())


def lfm2_moe_bundle() -> ModelBundle:
    """LFM2-MoE (tests/backends/test_lfm2.py's tiny one): layer 0 dense, then 4 sigmoid-routed experts."""
    from transformers import Lfm2MoeConfig, Lfm2MoeForCausalLM

    from tests.backends.test_lfm2 import TINY_MOE

    torch.manual_seed(0)
    hf = Lfm2MoeForCausalLM(Lfm2MoeConfig(**cast(dict[str, Any], TINY_MOE))).float().eval()
    with torch.no_grad():
        for name, param in hf.named_parameters():
            param.copy_((1.0 if name.endswith("norm.weight") else 0.0) + 0.25 * torch.randn_like(param))
        for name, buffer in hf.named_buffers():
            if name.endswith("expert_bias"):
                buffer.copy_(0.3 * torch.randn_like(buffer))
    return bundle_from_hf(hf)


def _same_state_halved(local: Any, load: functools.partial[ModelBundle]) -> None:
    """Each rank's state slot holds its channels' / heads' share: half the whole model's bytes."""
    state, whole = local.state_cache_spec, fp32_runner(load()).state_cache_spec
    assert state is not None and whole is not None
    assert state.bytes_per_slot * 2 == whole.bytes_per_slot


@pytest.mark.slow  # spawns gloo ranks: out of the fast tier, still in CI
def test_lfm2_tp2_matches_one_device() -> None:
    load = functools.partial(hybrid_bundle, "lfm2")

    def check(local: Any) -> None:
        conv = next(layer for layer in local.model.layers if layer.is_conv)
        assert tuple(conv.conv.shape) == (32, 1, 3) and tuple(conv.out.shape) == (64, 32)  # 32 of 64 channels
        _same_state_halved(local, load)

    assert_tp_parity(load, TP2, check)


@pytest.mark.slow  # spawns 4 gloo ranks
def test_lfm2_tp2_by_pp2_matches_one_device() -> None:
    """[conv, attention | conv, attention]: ranks 0-1 shard layers 0-1, ranks 2-3 layers 2-3."""

    def check(stage: Any) -> None:
        assert list(stage.plan.layers) == [0, 1] and stage.model.layers[1].heads == 2

    assert_tp_parity(functools.partial(hybrid_bundle, "lfm2"), TP2_PP2, check)


@pytest.mark.slow  # spawns gloo ranks
def test_nemotron_h_tp2_matches_one_device() -> None:
    """4 Mamba heads in 2 groups: each rank keeps 2 heads and the group they read (in_proj: z, x 32
    rows each, B, C 16, dt 2), half of each attention block's heads and of each MLP's width."""
    load = functools.partial(hybrid_bundle, "nemotron_h")

    def check(local: Any) -> None:
        mixer = local.model.layers[0].mamba
        assert (mixer.heads, mixer.groups) == (2, 1) and tuple(mixer.in_proj.shape) == (32 + 32 + 32 + 2, 64)
        _same_state_halved(local, load)

    assert_tp_parity(load, TP2, check)


@pytest.mark.slow  # spawns 4 gloo ranks
def test_nemotron_h_tp2_by_pp2_matches_one_device() -> None:
    """[mamba, mlp, attention | mlp, mamba, mlp]: each stage's blocks sharded over its 2 ranks."""

    def check(stage: Any) -> None:
        assert list(stage.plan.layers) == [0, 1, 2]

    assert_tp_parity(functools.partial(hybrid_bundle, "nemotron_h"), TP2_PP2, check)


def _granite_check(local: Any) -> None:
    block = local.model.layers[0]
    assert tuple(block.gate_up.shape) == (48, 64) and block.mamba.heads == 2  # 24 of 48 wide, 2 of 4


@pytest.mark.slow  # spawns gloo ranks
def test_granite_tp2_and_tp2_by_pp2_match_one_device() -> None:
    """Granite 4.0-H: the shared MLP's and the experts' widths halved per rank, one all-reduce after
    both (their sum), the embedding / logit scales after the vocab-parallel lookup and gather."""
    for options in (TP2, TP2_PP2):
        assert_tp_parity(granite_bundle, options, _granite_check)


def _qwen3_5_check(local: Any) -> None:
    layer = local.model.layers[0]
    assert (layer.k_heads, layer.v_heads) == (1, 2) and tuple(layer.in_proj.shape) == (68, 64)


@pytest.mark.slow  # spawns gloo ranks
def test_qwen3_5_tp2_and_tp2_by_pp2_match_one_device() -> None:
    """Qwen3.5 [DeltaNet x3, attention]: 1 of 2 key heads and its 2 value heads per rank (in_proj:
    q 16, k 16, v 16, z 16, b 2, a 2 rows), 2 of 4 gated attention heads; under TP x PP stage 0 of
    ranks 0-1 holds DeltaNet layers only."""
    for options in (TP2, TP2_PP2):
        assert_tp_parity(functools.partial(hybrid_bundle, "qwen3_5"), options, _qwen3_5_check)


@pytest.mark.slow  # spawns gloo ranks
def test_lfm2_moe_tp2_matches_one_device() -> None:
    """LFM2-MoE: each expert kept on both ranks at half its width, the router and expert bias replicated."""

    def check(local: Any) -> None:
        moe = local.model.layers[1].moe
        assert [tuple(e.down.shape) for e in moe.experts] == [(64, 16)] * 4

    assert_tp_parity(lfm2_moe_bundle, TP2, check)
