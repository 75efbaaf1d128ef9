"""LFM2 (short conv + GQA attention) on the torch runner against transformers' reference, float32, tiny
random weights: prompt logits, chunked prefill == one shot, ragged batched decode with a preemption ==
transformers' greedy generate, and the state the arch spec reports."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models
from transformers import Lfm2Config, Lfm2ForCausalLM, Lfm2MoeConfig, Lfm2MoeForCausalLM

from localchat.arch.registry import architecture
from localchat.backends.torch.runner import TorchRunner
from localchat.weights.config import ModelConfig
from localchat.weights.loader import load_model
from tests.helpers.hybrid_parity import assert_decode_matches_generate, assert_prefill_matches
from tests.helpers.torch_models import bundle_from_hf, fp32_runner

TINY = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 144,  # auto-adjusted: 2/3 -> 96, rounded up to a multiple of 64 -> 128
    "block_multiple_of": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "full_attn_idxs": [1, 3],
    "conv_L_cache": 3,
    "max_position_embeddings": 512,
    "tie_word_embeddings": False,
}
PROMPT = [int(t) for t in np.random.default_rng(1).integers(1, 256, size=40)]
TOL = 2e-3  # float32 sums in another order (test_mlx_lfm2.py holds MLX to the same bound)


def tiny_lfm2(seed: int = 0, **overrides: object) -> Lfm2ForCausalLM:
    torch.manual_seed(seed)
    model = Lfm2ForCausalLM(Lfm2Config(**{**TINY, **overrides})).float().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            scale = 0.2 if name.endswith("norm.weight") else 0.25
            base = 1.0 if name.endswith("norm.weight") else 0.0
            param.copy_(base + scale * torch.randn_like(param))
    return model


@pytest.fixture(scope="module")
def hf() -> Lfm2ForCausalLM:
    return tiny_lfm2()


@pytest.fixture(scope="module")
def runner(hf: Lfm2ForCausalLM) -> TorchRunner:
    r = fp32_runner(bundle_from_hf(hf))
    r.initialize_state_cache(4)
    return r


def test_prompt_logits_match_transformers(hf: Lfm2ForCausalLM, runner: TorchRunner) -> None:
    assert runner.config.intermediate_size == 128
    assert runner.kv_cache_spec.num_layers == 2  # K/V only for the attention layers
    assert_prefill_matches(hf, runner, PROMPT, tol=TOL)


def test_chunked_prefill_continues_from_the_state_the_last_chunk_left(
    hf: Lfm2ForCausalLM, runner: TorchRunner
) -> None:
    chunks = (5, 1, 1, 13, 20)  # one-token chunks take the decode path mid-prompt
    assert_prefill_matches(hf, runner, PROMPT, chunks, tol=TOL)


def test_ragged_batched_decode_with_a_preemption_matches_generate(
    hf: Lfm2ForCausalLM, runner: TorchRunner
) -> None:
    prompts = {"a": PROMPT[:9], "b": PROMPT, "c": PROMPT[30:33]}
    # "b" comes back as a 44-token prefill next to two decode rows
    assert_decode_matches_generate(hf, runner, prompts, 8, preempt=("b", 4))


def test_checkpoint_folder_loads_and_reports_its_state(tmp_path: Path, hf: Lfm2ForCausalLM) -> None:
    hf.save_pretrained(tmp_path)
    vocab = {f"t{i}": i for i in range(256)}
    (tmp_path / "tokenizer.json").write_text(Tokenizer(models.WordLevel(vocab, unk_token="t0")).to_str())
    bundle = load_model(tmp_path)
    assert bundle.config.extra["layer_types"] == ["conv", "full_attention"] * 2
    r = fp32_runner(bundle)
    spec = r.state_cache_spec
    # two conv layers, each a window of 2 inputs x 64 channels (float32 here)
    assert spec is not None and spec.num_layers == 2 and spec.bytes_per_slot == 2 * 2 * 64 * 4
    arch = architecture("lfm2")
    assert arch.state_bytes is not None and arch.state_bytes(bundle.config, 4) == spec.bytes_per_slot


def test_lfm2_1_2b_state_per_sequence() -> None:
    """LFM2-1.2B's published config: 16 layers, attention at 6 of them, hidden 2048, L_cache 3."""
    config = ModelConfig.from_hf_dict(
        {
            "model_type": "lfm2",
            "vocab_size": 65536,
            "hidden_size": 2048,
            "intermediate_size": 12288,
            "block_ff_dim": 12288,
            "num_hidden_layers": 16,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "full_attn_idxs": [2, 5, 8, 10, 12, 14],
            "conv_L_cache": 3,
        }
    )
    assert config.intermediate_size == 8192
    arch = architecture("lfm2")
    assert arch.state_bytes is not None and arch.state_bytes(config, 2) == 10 * 2048 * 2 * 2  # 80 KiB


TINY_MOE = {
    **{k: v for k, v in TINY.items() if not k.startswith("block_") and k != "full_attn_idxs"},
    "layer_types": ["conv", "full_attention", "conv", "full_attention"],
    "intermediate_size": 96,  # the dense layer's, as given
    "moe_intermediate_size": 32,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "num_dense_layers": 1,
    "routed_scaling_factor": 1.5,
}


def test_lfm2_moe_matches_transformers() -> None:
    """LFM2-MoE: layer 0 dense, then sigmoid-routed experts whose (randomised) bias steers the choice."""
    torch.manual_seed(0)
    hf = Lfm2MoeForCausalLM(Lfm2MoeConfig(**TINY_MOE)).float().eval()
    with torch.no_grad():
        for name, param in hf.named_parameters():
            base = 1.0 if name.endswith("norm.weight") else 0.0
            param.copy_(base + 0.25 * torch.randn_like(param))
        for name, buffer in hf.named_buffers():
            if name.endswith("expert_bias"):
                buffer.copy_(0.3 * torch.randn_like(buffer))
    runner = fp32_runner(bundle_from_hf(hf))
    assert runner.config.intermediate_size == 96
    runner.initialize_state_cache(4)
    assert_prefill_matches(hf, runner, PROMPT, tol=TOL)
    assert_decode_matches_generate(hf, runner, {"b": PROMPT[:9], "c": PROMPT[30:33]}, 6)
