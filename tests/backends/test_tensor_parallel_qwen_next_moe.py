"""Qwen3-Next and Qwen3.5-MoE under tensor parallelism: DeltaNet cut by key head and gated attention by
head (as dense Qwen3.5, shard_deltanet.py), every MLP a sparse MoE whose 6 routed experts and shared
expert are all kept on every rank at half their width (experts 32 -> 16, shared 48 -> 24), the router
and the shared expert's sigmoid gate replicated, one all-reduce for the block. TP=2 (gloo, 2 processes)
(and TP=2 x PP=2 for Qwen3-Next) gives one device's greedy tokens and float32 logits within 1e-4:
ragged batched prefill then decode (a 70-token prompt: two DeltaNet chunks), and a chunked prefill with
a preemption (tests/helpers/tp_parity.py)."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from localchat.backends import RunnerOptions
from localchat.backends.torch.parallel.shard import valid_sizes
from localchat.weights.bundle import ModelBundle
from tests.helpers.torch_models import bundle_from_hf
from tests.helpers.tp_parity import TP2, TP2_PP2, assert_tp_parity


def moe_bundle(model_type: str) -> ModelBundle:
    """tests/backends/test_qwen3_next_moe.py's tiny model (seeded: also the workers' loader)."""
    from tests.backends.test_qwen3_next_moe import tiny_model

    return bundle_from_hf(tiny_model(model_type))


def _check(local: Any) -> None:
    layer = local.model.layers[0]
    assert (layer.k_heads, layer.v_heads) == (1, 2)
    assert [tuple(e.down.shape) for e in layer.moe.experts] == [(64, 16)] * 6  # every expert, half wide
    assert tuple(layer.moe.shared.down.shape) == (64, 24) and tuple(layer.moe.shared_gate.shape) == (1, 64)


@pytest.mark.slow  # spawns gloo ranks
@pytest.mark.parametrize(
    ("model_type", "options"),
    [("qwen3_next", TP2), ("qwen3_5_moe_text", TP2), ("qwen3_next", TP2_PP2)],
    ids=["qwen3_next-tp2", "qwen3_5_moe-tp2", "qwen3_next-tp2xpp2"],
)
def test_moe_hybrid_tp2_matches_one_device(model_type: str, options: RunnerOptions) -> None:
    """TP=2, and TP=2 x PP=2 (4 processes: each stage's 2 layers sharded over its 2 ranks)."""
    load = functools.partial(moe_bundle, model_type)
    assert valid_sizes(load().config, 4) == [1, 2]  # 4 does not split its 2 DeltaNet key heads
    assert_tp_parity(load, options, _check)
