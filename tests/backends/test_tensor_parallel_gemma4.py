"""Gemma 4 under tensor parallelism (shard_gemma4.py): tiny random models from transformers' classes with
sliding (16-wide heads) and global (32-wide heads, proportional RoPE) layers, an 8-token window shorter
than the prompts, per-layer scalars and the final soft-cap; one with keys as values on the global layers
(a single KV head there, kept whole on both ranks), K/V-sharing layers and a double-wide MLP; one
E2B-shaped (per-layer embeddings, replicated, and K/V sharing). TP=2 (gloo, 2 processes) gives one
device's greedy tokens and float32 logits within 1e-4, ragged then decode, and chunked with a
preemption (tests/helpers/tp_parity.py); TP=2 x PP=2 (4 processes) of an E2B-shaped 6-layer model the
same. The MoE Gemma 4: test_tensor_parallel_gemma4_moe.py."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from localchat.backends.torch.parallel.shard import check_supported, valid_sizes
from localchat.errors import BackendUnavailableError
from tests.backends.test_pipeline_gemma import loop_bundle
from tests.backends.test_pipeline_gemma4_ple import e2b_bundle
from tests.helpers.tp_parity import TP2, TP2_PP2, assert_tp_parity

# name -> each rank's (q heads, KV heads) per layer: 2 of 4 q heads; 1 of 2 KV heads, or the global
# layers' single K=V head kept whole on each rank.
CASES: dict[str, list[tuple[int, int]]] = {
    "gemma4": [(2, 1)] * 4,
    "gemma4-k-eq-v-shared": [(2, 1)] * 4,
    "gemma4-per-layer-embeddings": [(2, 1)] * 4,
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.slow  # spawns a gloo rank: out of the fast tier, still in CI
def test_tp2_matches_one_device(name: str) -> None:
    dims = loop_bundle(name).config.extra["layer_head_dims"]

    def check(local: Any) -> None:
        layers = local.model.layers
        assert [(layer.heads, layer.kv_heads) for layer in layers] == CASES[name]
        assert [layer.q.shape[0] for layer in layers] == [2 * d for d in dims]  # each layer's own d

    assert_tp_parity(functools.partial(loop_bundle, name), TP2, check)


@pytest.mark.slow  # spawns 4 gloo ranks
def test_tp2_by_pp2_matches_one_device() -> None:
    """E2B-shaped [S, F] x 3, layers 4-5 reading 2-3's K/V: ranks 0-1 shard layers 0-1, ranks 2-3 layers
    2-5 (each stage's per-layer table columns, replicated across its two ranks) and the head."""

    def check(stage: Any) -> None:
        assert list(stage.plan.layers) == [0, 1] and stage.model.layers[0].heads == 2

    assert_tp_parity(e2b_bundle, TP2_PP2, check)


def test_sizes_follow_every_layers_kv_heads() -> None:
    """4 q heads, KV heads 2 (sliding) and 1 (global, K=V): 1, 2 and 4 ranks split it (a rank keeps a
    whole KV head where there are fewer than ranks); 3 does not divide the heads."""
    config = loop_bundle("gemma4-k-eq-v-shared").config
    assert config.extra["layer_kv_heads"] == [2, 1, 2, 1]
    assert valid_sizes(config, 8) == [1, 2, 4]
    check_supported(config, 2)
    with pytest.raises(BackendUnavailableError, match="--pipeline-parallel-size 3"):
        check_supported(config, 3)
