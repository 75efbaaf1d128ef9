"""Tensor parallelism beyond Llama on gloo with 2 CPU processes: Qwen3 (q/k norm) and the MoE families
(Mixtral, Qwen3-MoE), whose experts are cut like the dense MLP along their intermediate dim (router
replicated, one all-reduce after the MoE block). TP=2 logits within 1e-4 and greedy tokens equal one
device's, ragged then decode and chunked with a preemption (tests/helpers/tp_parity.py)."""

from __future__ import annotations

import functools
from typing import Any, cast

import pytest

from localchat.backends.torch.models.moe import Expert, SparseMoe
from localchat.weights.bundle import ModelBundle
from tests.helpers.torch_models import bundle_from_hf, fp32_runner, tiny_hf_model
from tests.helpers.tp_parity import TP2, assert_tp_parity


def _bundle(model_type: str) -> ModelBundle:
    return bundle_from_hf(tiny_hf_model(model_type, vocab_size=255))


def _expert_shapes(model: Any) -> list[tuple[int, ...]] | None:
    moe = next((m for m in model.modules() if isinstance(m, SparseMoe)), None)
    return None if moe is None else [tuple(cast(Expert, e).down.shape) for e in moe.experts]


@pytest.mark.parametrize("model_type", ["qwen3", "mixtral", "qwen3_moe"])
@pytest.mark.slow  # spawns gloo ranks: out of the fast tier, still in CI
def test_tp2_matches_tp1(model_type: str) -> None:
    load = functools.partial(_bundle, model_type)
    whole = _expert_shapes(fp32_runner(load()).model)

    def check(local: Any) -> None:  # every expert kept, each with half its intermediate width
        widths = _expert_shapes(local.model)
        if whole is None:
            assert widths is None
        else:
            hidden, size = whole[0]
            assert widths == [(hidden, size // 2)] * len(whole)

    assert_tp_parity(load, TP2, check)
