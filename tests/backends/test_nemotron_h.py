"""Nemotron-H (Mamba-2, attention and relu² MLP blocks by pattern) on the torch runner against
transformers' reference, float32, tiny random weights: prompt logits over two SSD chunks, chunked prefill
== one shot, ragged batched decode with a preemption == greedy generate, a hub-layout folder (`backbone.`
names, hybrid_override_pattern), and the state the arch spec reports."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, models
from transformers import NemotronHConfig, NemotronHForCausalLM

from localchat.arch.registry import architecture
from localchat.backends.torch.runner import TorchRunner
from localchat.errors import ModelLoadError
from localchat.weights.config import ModelConfig
from localchat.weights.loader import load_model
from tests.helpers.hybrid_parity import assert_decode_matches_generate, assert_prefill_matches
from tests.helpers.torch_models import bundle_from_hf, fp32_runner

TINY = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 96,
    "layers_block_type": ["mamba", "mlp", "attention", "mlp", "mamba", "mlp"],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "mamba_num_heads": 4,
    "mamba_head_dim": 16,
    "n_groups": 2,
    "ssm_state_size": 16,
    "conv_kernel": 4,
    "max_position_embeddings": 512,
    "tie_word_embeddings": False,
}
PROMPT = [int(t) for t in np.random.default_rng(1).integers(1, 256, size=70)]  # 70: two 64-token chunks
TOL = 2e-3


def tiny_nemotron_h(seed: int = 0) -> NemotronHForCausalLM:
    torch.manual_seed(seed)
    model = NemotronHForCausalLM(NemotronHConfig(**TINY)).float().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("A_log", "dt_bias")):
                param.add_(0.3 * torch.randn_like(param))
            elif name.endswith("norm.weight"):
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            else:
                param.copy_(0.25 * torch.randn_like(param))
    return model


@pytest.fixture(scope="module")
def hf() -> NemotronHForCausalLM:
    return tiny_nemotron_h()


@pytest.fixture(scope="module")
def runner(hf: NemotronHForCausalLM) -> TorchRunner:
    r = fp32_runner(bundle_from_hf(hf))
    r.initialize_state_cache(4)
    return r


def test_prompt_logits_match_transformers(hf: NemotronHForCausalLM, runner: TorchRunner) -> None:
    assert runner.kv_cache_spec.num_layers == 1  # K/V only for the one attention block
    assert_prefill_matches(hf, runner, PROMPT, tol=TOL)


def test_chunked_prefill_continues_from_the_state_the_last_chunk_left(
    hf: NemotronHForCausalLM, runner: TorchRunner
) -> None:
    chunks = (5, 30, 35)
    assert_prefill_matches(hf, runner, PROMPT, chunks, tol=TOL)


def test_ragged_batched_decode_with_a_preemption_matches_generate(
    hf: NemotronHForCausalLM, runner: TorchRunner
) -> None:
    prompts = {"a": PROMPT[:9], "b": PROMPT, "c": PROMPT[30:33]}
    # "b" comes back as a 74-token prefill next to two decode rows
    assert_decode_matches_generate(hf, runner, prompts, 8, preempt=("b", 4))


def test_hub_layout_folder_loads_and_reports_its_state(tmp_path: Path, hf: NemotronHForCausalLM) -> None:
    """As the hub ships it: weights under `backbone.`, block kinds as hybrid_override_pattern."""
    hf.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    save_file(
        {k.replace("model.", "backbone.", 1): v for k, v in weights.items()}, tmp_path / "model.safetensors"
    )
    config = json.loads((tmp_path / "config.json").read_text())
    del config["layers_block_type"]
    config["hybrid_override_pattern"] = "M-*-M-"
    config["num_hidden_layers"] = 6
    (tmp_path / "config.json").write_text(json.dumps(config))
    vocab = {f"t{i}": i for i in range(256)}
    (tmp_path / "tokenizer.json").write_text(Tokenizer(models.WordLevel(vocab, unk_token="t0")).to_str())
    bundle = load_model(tmp_path)
    r = fp32_runner(bundle)
    spec = r.state_cache_spec
    # per Mamba-2 layer: window 3 x (64 + 2 * 2 * 16) float32 + state 4 x 16 x 16 float32
    assert spec is not None and spec.num_layers == 2
    assert spec.bytes_per_slot == 2 * (3 * 128 * 4 + 4 * 16 * 16 * 4)
    arch = architecture("nemotron_h")
    assert arch.state_bytes is not None and arch.state_bytes(bundle.config, 4) == spec.bytes_per_slot
    r.initialize_state_cache(1)
    assert_prefill_matches(hf, r, PROMPT[:20], tol=TOL)


NANO_9B_V2 = {
    "model_type": "nemotron_h",
    "vocab_size": 131072,
    "hidden_size": 4480,
    "intermediate_size": 15680,
    "num_hidden_layers": 56,
    "num_attention_heads": 40,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hybrid_override_pattern": "M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-",
    "mamba_num_heads": 128,
    "mamba_head_dim": 80,
    "n_groups": 8,
    "ssm_state_size": 128,
    "conv_kernel": 4,
}


def test_nemotron_nano_9b_v2_state_per_sequence() -> None:
    """The published config: 27 Mamba-2 blocks of 128 heads x 80 x d_state 128, 8 groups."""
    config = ModelConfig.from_hf_dict(NANO_9B_V2)
    assert config.extra["block_kinds"].count("mamba") == 27
    arch = architecture("nemotron_h")
    conv = (128 * 80 + 2 * 8 * 128) * 3 * 2
    assert arch.state_bytes is not None and arch.state_bytes(config, 2) == 27 * (conv + 128 * 80 * 128 * 4)


def test_moe_blocks_are_refused_with_a_clear_error() -> None:
    with pytest.raises(ModelLoadError, match="mixture-of-experts"):
        ModelConfig.from_hf_dict({**NANO_9B_V2, "hybrid_override_pattern": "ME*E"})
