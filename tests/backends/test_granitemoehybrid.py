"""Granite 4.0-H (Mamba-2 + attention, top-k MoE beside a shared MLP) on the torch runner against
transformers' reference, float32, tiny random weights: prompt logits over two SSD chunks, chunked prefill
== one shot, ragged batched decode with a preemption == greedy generate, the two scan forms agree, and
the state the arch spec reports."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models
from transformers import GraniteMoeHybridConfig, GraniteMoeHybridForCausalLM

from localchat.arch.registry import architecture
from localchat.backends.torch.mamba2 import ssd_chunked, ssd_step
from localchat.backends.torch.runner import TorchRunner
from localchat.engine.config import DEFAULT_STATE_CHECKPOINTS
from localchat.models.memory import MIN_KV_BUDGET, estimate
from localchat.weights.config import ModelConfig
from localchat.weights.loader import load_model
from tests.helpers.hybrid_parity import assert_decode_matches_generate, assert_prefill_matches
from tests.helpers.torch_models import bundle_from_hf, fp32_runner

TINY = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 32,  # each expert's
    "shared_intermediate_size": 48,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "layer_types": ["mamba", "attention", "mamba", "attention"],
    "mamba_n_heads": 4,  # head_dim 2 * 64 / 4 = 32
    "mamba_n_groups": 2,
    "mamba_d_state": 16,
    "mamba_d_conv": 4,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "embedding_multiplier": 2.0,
    "logits_scaling": 3.0,
    "residual_multiplier": 0.5,
    "attention_multiplier": 0.3,
    "position_embedding_type": "rope",
    "max_position_embeddings": 512,
    "tie_word_embeddings": False,
}
PROMPT = [int(t) for t in np.random.default_rng(1).integers(1, 256, size=70)]  # 70: two 64-token chunks
TOL = 2e-3


def tiny_granite(seed: int = 0, **overrides: object) -> GraniteMoeHybridForCausalLM:
    torch.manual_seed(seed)
    config = GraniteMoeHybridConfig(**{**TINY, **overrides})
    model = GraniteMoeHybridForCausalLM(config).float().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("A_log", "dt_bias")):
                param.add_(0.3 * torch.randn_like(param))  # transformers' init (A = 1..H), spread a little
            elif name.endswith("norm.weight"):
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            else:
                param.copy_(0.25 * torch.randn_like(param))
    return model


@pytest.fixture(scope="module")
def hf() -> GraniteMoeHybridForCausalLM:
    return tiny_granite()


@pytest.fixture(scope="module")
def runner(hf: GraniteMoeHybridForCausalLM) -> TorchRunner:
    r = fp32_runner(bundle_from_hf(hf))
    r.initialize_state_cache(4)
    return r


def test_prompt_logits_match_transformers(hf: GraniteMoeHybridForCausalLM, runner: TorchRunner) -> None:
    assert runner.kv_cache_spec.num_layers == 2  # K/V only for the attention layers
    assert_prefill_matches(hf, runner, PROMPT, tol=TOL)


def test_chunked_prefill_continues_from_the_state_the_last_chunk_left(
    hf: GraniteMoeHybridForCausalLM, runner: TorchRunner
) -> None:
    chunks = (5, 1, 30, 34)  # a one-token chunk takes the decode path mid-prompt
    assert_prefill_matches(hf, runner, PROMPT, chunks, tol=TOL)


def test_ragged_batched_decode_with_a_preemption_matches_generate(
    hf: GraniteMoeHybridForCausalLM, runner: TorchRunner
) -> None:
    prompts = {"a": PROMPT[:9], "b": PROMPT, "c": PROMPT[30:33]}
    # "b" comes back as a 74-token prefill next to two decode rows
    assert_decode_matches_generate(hf, runner, prompts, 8, preempt=("b", 4))


def test_recurrent_form_equals_chunked_form() -> None:
    torch.manual_seed(0)
    length, heads, p, n = 37, 3, 5, 4
    x, b, c = torch.randn(length, heads, p), torch.randn(length, heads, n), torch.randn(length, heads, n)
    dt = torch.rand(length, heads)
    a = -dt * torch.rand(heads)
    state = torch.randn(heads, p, n)
    chunked, final = ssd_chunked(x, dt, a, b, c, state, chunk=16)
    s, steps = state[None], []
    for t in range(length):
        o, s = ssd_step(x[t : t + 1], dt[t : t + 1], a[t : t + 1], b[t : t + 1], c[t : t + 1], s)
        steps.append(o)
    assert torch.allclose(chunked, torch.cat(steps), atol=1e-4)
    assert torch.allclose(final, s[0], atol=1e-4)


def test_checkpoint_folder_loads_and_reports_its_state(tmp_path: Path) -> None:
    """A saved folder (the hub's stacked expert names: block_sparse_moe.input_linear), NoPE attention."""
    hf = tiny_granite(position_embedding_type=None)
    hf.save_pretrained(tmp_path)
    vocab = {f"t{i}": i for i in range(256)}
    (tmp_path / "tokenizer.json").write_text(Tokenizer(models.WordLevel(vocab, unk_token="t0")).to_str())
    bundle = load_model(tmp_path)
    r = fp32_runner(bundle)
    spec = r.state_cache_spec
    # per Mamba-2 layer: window 3 x (128 + 2 * 2 * 16) float32 + state 4 x 32 x 16 float32
    assert spec is not None and spec.num_layers == 2
    assert spec.bytes_per_slot == 2 * (3 * 192 * 4 + 4 * 32 * 16 * 4)
    arch = architecture("granitemoehybrid")
    assert arch.state_bytes is not None and arch.state_bytes(bundle.config, 4) == spec.bytes_per_slot
    # The RAM estimate adds the pool: one bf16-window slot per sequence that may run, plus the prefix
    # checkpoints' slots.
    slot_bf16 = 2 * (3 * 192 * 2 + 4 * 32 * 16 * 4)
    assert (
        estimate(tmp_path, None, max_num_seqs=3, state_checkpoints=0).kv_cache
        == MIN_KV_BUDGET + 3 * slot_bf16
    )
    with_checkpoints = MIN_KV_BUDGET + (3 + DEFAULT_STATE_CHECKPOINTS) * slot_bf16
    assert estimate(tmp_path, None, max_num_seqs=3).kv_cache == with_checkpoints
    r.initialize_state_cache(1)
    assert_prefill_matches(hf, r, PROMPT[:20], tol=TOL)


def test_granite_4_0_h_tiny_state_per_sequence() -> None:
    """Granite 4.0-H Tiny's published config: 40 layers, 36 Mamba-2 (4 attention), hidden 1536, 48
    heads of 64, 1 group, d_state 128, conv 4."""
    kinds = ["attention" if i in (5, 15, 25, 35) else "mamba" for i in range(40)]
    config = ModelConfig.from_hf_dict(
        {
            "model_type": "granitemoehybrid",
            "vocab_size": 100352,
            "hidden_size": 1536,
            "intermediate_size": 512,
            "num_hidden_layers": 40,
            "num_attention_heads": 12,
            "num_key_value_heads": 4,
            "layer_types": kinds,
            "mamba_n_heads": 48,
            "mamba_d_head": 64,
            "mamba_n_groups": 1,
            "mamba_d_state": 128,
            "mamba_d_conv": 4,
            "mamba_expand": 2,
        }
    )
    arch = architecture("granitemoehybrid")
    conv = (3072 + 2 * 128) * 3 * 2
    assert arch.state_bytes is not None and arch.state_bytes(config, 2) == 36 * (conv + 48 * 64 * 128 * 4)
