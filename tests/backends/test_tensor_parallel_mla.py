"""DeepSeek-V2 / V3 and Mistral 4 (multi-head latent attention + shared-expert MoE) under tensor
parallelism: q (or q_b) and kv_b cut by head, q_a / kv_a and their norms replicated, o row-parallel;
every routed and shared expert kept on each rank at half its width, the router replicated
(shard_mla.py). TP=2 (gloo, 2 processes), and TP=2 x PP=2 for V3 (4 processes), give one device's
greedy tokens and float32 logits within 1e-4 for a ragged batched prefill then decode and a chunked
prefill with a preemption; a deepseek2 GGUF (Q8_0, llama.cpp's split attn_k_b / attn_v_b) and a Mistral
Small 4 GGUF from llama.cpp's converter (Q8_0, stacked gate|up experts) too."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

from localchat.backends import RunnerOptions
from localchat.backends.torch.parallel.shard import valid_sizes
from localchat.weights.bundle import ModelBundle
from localchat.weights.config import ModelConfig
from localchat.weights.loader import load_model
from tests.helpers.tiny_gguf import TINY_VOCAB_SIZE, write_tiny_gguf
from tests.helpers.torch_models import VARIANTS, bundle_from_hf, tiny_hf_model
from tests.helpers.tp_parity import TP2, TP2_PP2, assert_tp_parity


def mla_bundle(variant: str) -> ModelBundle:
    """The workers' loader too (seeded: every rank builds the same weights). torch_models' DeepSeek
    variants (4 heads, layer 0 dense, layer 1 four experts 32 wide + a shared one) and test_mistral4's."""
    if variant.startswith("mistral4"):
        from tests.backends.test_mistral4 import VARIANTS as MISTRAL4  # registers Mistral4ForCausalLM

        return bundle_from_hf(tiny_hf_model("mistral4", **MISTRAL4[variant]))
    model_type, overrides = VARIANTS[variant]
    return bundle_from_hf(tiny_hf_model(model_type, **overrides))


def gguf_bundle(path: Path) -> ModelBundle:
    return load_model(path)


def check_rank_slice(runner: Any) -> None:
    """Rank 0 holds 2 of 4 heads' q and kv_b rows and o columns, the whole latent projection, half of
    every expert and of the dense MLP, and K/V for its 2 heads."""
    dense, sparse = runner.model.layers[0], runner.model.layers[1]
    mla = sparse.mla
    assert mla.heads == 2
    assert sparse.q.shape[0] == 2 * mla.qk_dim
    assert sparse.kv_b.shape[0] == 2 * (mla.nope_dim + mla.v_dim)
    assert tuple(sparse.o.shape) == (64, 2 * mla.v_dim)
    assert tuple(sparse.kv_a.shape) == (mla.kv_lora_rank + mla.rope_dim, 64)  # replicated
    assert [tuple(e.down.shape) for e in sparse.moe.experts] == [(64, 16)] * 4
    assert [tuple(e.gate_up.shape) for e in sparse.moe.experts] == [(32, 64)] * 4  # 16 of gate, 16 of up
    assert tuple(sparse.moe.shared.down.shape) == (64, 16)
    assert tuple(dense.down.shape) == (64, 64)
    spec = runner.kv_cache_spec  # its heads' expanded keys and values only
    assert (spec.num_kv_heads, spec.head_dim) == (2, mla.cache_dim)


def _sizes(variant: str) -> list[int]:
    config: ModelConfig = mla_bundle(variant).config
    return valid_sizes(config, 8)


@pytest.mark.slow  # spawns gloo ranks
@pytest.mark.parametrize(
    ("variant", "options"),
    [
        ("deepseek_v2-lite", TP2),  # one q_proj, greedy softmax routing
        ("deepseek_v2", TP2),  # low-rank q, group-limited softmax routing, biases, yarn
        ("deepseek_v3", TP2),  # sigmoid router + choice bias, groups ranked by their best two
        ("deepseek_v3-halves", TP2),  # values wider than keys: q and k padded in the cache
        ("deepseek_v3", TP2_PP2),  # each stage's one layer sharded over its 2 ranks
        ("mistral4", TP2),  # V3's layer with a softmax router and the per-token q temperature
    ],
    ids=["v2_lite-tp2", "v2-tp2", "v3-tp2", "v3_halves-tp2", "v3-tp2xpp2", "mistral4-tp2"],
)
def test_mla_tp2_matches_one_device(variant: str, options: RunnerOptions) -> None:
    assert _sizes(variant) == [1, 2, 4]  # the 4 heads (the MLP and expert widths allow 8)
    check = check_rank_slice if options.pipeline_parallel_size == 1 else None
    assert_tp_parity(functools.partial(mla_bundle, variant), options, check)


@pytest.mark.slow  # spawns gloo ranks
def test_deepseek2_gguf_tp2_matches_one_device(tmp_path: Path) -> None:
    """llama.cpp's deepseek2 file: each rank cuts its heads out of attn_k_b (F32: 16-wide rows) and
    attn_v_b (Q8_0 rows), which the family's sanitize merges into the rank's kv_b; o's 24-column cut
    splits Q8_0 blocks (dequantized); the stacked experts are split, then cut by width."""
    model_type, overrides = VARIANTS["deepseek_v3"]
    hf = tiny_hf_model(model_type, vocab_size=TINY_VOCAB_SIZE, **overrides)
    path = write_tiny_gguf(tmp_path / "ds.gguf", hf, qtype="Q8_0")
    assert_tp_parity(functools.partial(gguf_bundle, path), TP2, check_rank_slice)


@pytest.mark.slow  # spawns gloo ranks; runs llama.cpp's converter
def test_mistral_small_4_converted_gguf_tp2_matches_one_device(tmp_path: Path) -> None:
    """Mistral Small 4 as published (Mistral3ForConditionalGeneration) through llama.cpp's own converter
    at q8_0: its text model's `mistral4` file, whose experts' gate and up are one stacked tensor (each
    rank keeps its rows of both halves of every expert)."""
    from tests.backends.test_gguf_2026_families import _gguf, _model_and_folder

    _, folder = _model_and_folder("mistral4", {}, tmp_path)
    path = _gguf(folder, "q8_0")
    assert_tp_parity(functools.partial(gguf_bundle, path), TP2, check_rank_slice)
