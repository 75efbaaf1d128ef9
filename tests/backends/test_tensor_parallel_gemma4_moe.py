"""The MoE Gemma 4 (26B-A4B's shape) under tensor parallelism: every layer has a dense GeGLU MLP and an
expert block beside it, each normed before they are added, so each is summed across the ranks first
(two all-reduces after attention's one). The 4 experts are kept on every rank at half their width
(32 -> 16), the router, its scales and the block's norms replicated; attention as the dense Gemma 4's
(shard_gemma4.py). TP=2 (gloo, 2 processes) and TP=2 x PP=2 (4 processes) give one device's greedy
tokens and float32 logits within 1e-4, ragged then decode and chunked with a preemption
(tests/helpers/tp_parity.py); so does TP=2 on a q8_0 GGUF from llama.cpp's own converter (stacked
gate|up experts)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

from localchat.backends import RunnerOptions
from localchat.backends.torch.parallel.shard import check_supported, valid_sizes
from localchat.weights.bundle import ModelBundle
from localchat.weights.loader import load_model
from tests.backends.test_pipeline_gemma import loop_bundle
from tests.helpers.tp_parity import TP2, TP2_PP2, assert_tp_parity


def check_rank_slice(runner: Any) -> None:
    """Rank 0 (stage 0 under --pp) holds 2 of 4 q heads, half the dense MLP and half of every expert."""
    for layer in runner.model.layers:
        assert layer.heads == 2 and tuple(layer.down.shape) == (64, 64)
        assert [tuple(e.gate_up.shape) for e in layer.moe.experts] == [(32, 64)] * 4  # 16 gate + 16 up
        assert [tuple(e.down.shape) for e in layer.moe.experts] == [(64, 16)] * 4
        assert tuple(layer.moe.router.shape) == (4, 64)  # replicated


def gguf_bundle(path: Path) -> ModelBundle:
    return load_model(path)


def test_the_moe_gemma4_is_sharded_at_sizes_that_split_its_experts() -> None:
    config = loop_bundle("gemma4-moe").config
    check_supported(config, 2)
    assert valid_sizes(config, 64) == [1, 2, 4]  # the 4 q heads (experts 32 wide, the MLP 128)


@pytest.mark.slow  # spawns gloo ranks
@pytest.mark.parametrize("options", [TP2, TP2_PP2], ids=["tp2", "tp2xpp2"])
def test_moe_gemma4_matches_one_device(options: RunnerOptions) -> None:
    assert_tp_parity(functools.partial(loop_bundle, "gemma4-moe"), options, check_rank_slice)


@pytest.mark.slow  # spawns gloo ranks; runs llama.cpp's converter
def test_moe_gemma4_converted_gguf_tp2_matches_one_device(tmp_path: Path) -> None:
    """llama.cpp's gemma4 file of the same model at q8_0: the experts' gate and up stacked in one
    tensor (`ffn_gate_up_exps`), moved under the MoE block and split per expert before the cut."""
    from tests.backends.test_gguf_2026_families import _gguf, _model_and_folder

    _, folder = _model_and_folder("gemma4-moe", {}, tmp_path)
    path = _gguf(folder, "q8_0")
    assert_tp_parity(functools.partial(gguf_bundle, path), TP2, check_rank_slice)
