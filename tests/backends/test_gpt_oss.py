"""gpt-oss (gpt_oss) against transformers' GptOssForCausalLM (fp32), torch runner: attention sinks on the
prefill and decode paths, a 4-token sliding window on even layers, YaRN rope (truncate off), q/k/v/o
biases, a biased top-k router (softmax over the chosen logits) and clamped SwiGLU experts with biases
stored stacked, transposed and interleaved.

The parity suite's paged-cache checks run here on this module's own `pair` fixture."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, GptOssConfig

from localchat.backends.torch.runner import TorchRunner
from localchat.weights.config import ModelConfig
from tests.backends.test_torch_parity import (  # noqa: F401  (collected here, on this module's `pair`)
    test_batch_of_different_lengths,
    test_chunked_prefill,
    test_greedy_generation_matches_generate,
    test_mixed_prefill_and_decode,
    test_prompt_and_greedy_decode_logits,
)
from tests.helpers.torch_models import bundle_from_hf, fp32_runner

TINY: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 256,
    "num_local_experts": 6,
    "num_experts_per_tok": 4,
    "sliding_window": 4,
    "max_position_embeddings": 512,
    "rope_parameters": {
        "rope_type": "yarn",
        "rope_theta": 150000.0,
        "factor": 4.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
        "original_max_position_embeddings": 16,
    },
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}


def tiny_gpt_oss(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = GptOssConfig(**TINY)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            elif name.endswith("sinks"):
                param.copy_(2.0 * torch.randn_like(param))  # large enough to take real probability mass
            else:
                param.copy_(0.15 * torch.randn_like(param))
    return model


@pytest.fixture(scope="module")
def pair() -> tuple[torch.nn.Module, TorchRunner]:
    hf = tiny_gpt_oss()
    return hf, fp32_runner(bundle_from_hf(hf))


def test_config_reads_windows_and_experts() -> None:
    config = ModelConfig.from_hf_dict(tiny_gpt_oss().config.to_dict())
    assert config.sliding_window == 4
    assert config.extra["layer_types"] == ["sliding_attention", "full_attention"]
    assert (config.extra["num_local_experts"], config.extra["num_experts_per_tok"]) == (6, 4)
