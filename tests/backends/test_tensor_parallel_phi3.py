"""Phi-3 / Phi-4-mini under tensor parallelism: Llama's layer on the checkpoint's fused tensors, so each
rank takes its q rows and its KV heads' k and v rows out of qkv_proj, and its rows of each half of
gate_up_proj (shard_weights.py). Tiny random models, full rotary (Phi-3) and 3/4 rotary (Phi-4-mini).
TP=2 (gloo, 2 processes), and TP=2 x PP=2 (4), give one device's greedy tokens and float32 logits
within 1e-4: ragged batched prefill then decode, and a chunked prefill with a preemption
(tests/helpers/tp_parity.py)."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from localchat.backends import RunnerOptions
from localchat.weights.bundle import ModelBundle
from tests.helpers.torch_models import bundle_from_hf, tiny_hf_model
from tests.helpers.tp_parity import TP2, TP2_PP2, assert_tp_parity


def phi3_bundle(rotary: float) -> ModelBundle:
    """Seeded: also the workers' loader. 4 heads of 16, 2 KV heads, MLP 128 wide."""
    return bundle_from_hf(tiny_hf_model("phi3", vocab_size=255, partial_rotary_factor=rotary))


def _check(local: Any) -> None:
    layer = local.model.layers[0]
    assert (layer.heads, layer.kv_heads) == (2, 1)
    assert tuple(layer.qkv.shape) == ((2 + 2 * 1) * 16, 64) and tuple(layer.down.shape) == (64, 64)


@pytest.mark.slow  # spawns gloo ranks
@pytest.mark.parametrize(
    ("rotary", "options"),
    [(1.0, TP2), (0.75, TP2), (0.75, TP2_PP2)],
    ids=["phi3-tp2", "phi4-mini-tp2", "phi4-mini-tp2xpp2"],
)
def test_phi3_tp2_matches_one_device(rotary: float, options: RunnerOptions) -> None:
    assert_tp_parity(functools.partial(phi3_bundle, rotary), options, _check)
