"""Tiny random Hugging Face models (fp32) and a `ModelBundle` over their weights, for parity tests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    DeepseekV2Config,
    DeepseekV3Config,
    Gemma2Config,
    Gemma3TextConfig,
    Gemma4TextConfig,
    Glm4MoeConfig,
    Llama4TextConfig,
    LlamaConfig,
    Ministral3Config,
    MinistralConfig,
    Mistral4Config,
    MistralConfig,
    MixtralConfig,
    Phi3Config,
    PretrainedConfig,
    Qwen2Config,
    Qwen3Config,
    Qwen3MoeConfig,
    SmolLM3Config,
)

from localchat.backends import RunnerOptions
from localchat.backends.torch.quant import QUANT_ENV
from localchat.backends.torch.runner import TorchRunner
from localchat.weights.bundle import ModelBundle
from localchat.weights.config import ModelConfig
from localchat.weights.tensors import WeightTensor

CONFIGS: dict[str, type[PretrainedConfig]] = {
    "llama": LlamaConfig,
    "mistral": MistralConfig,
    "qwen2": Qwen2Config,
    "qwen3": Qwen3Config,
    "gemma2": Gemma2Config,
    "gemma3_text": Gemma3TextConfig,
    "phi3": Phi3Config,
    "ministral": MinistralConfig,
    "ministral3": Ministral3Config,
    "qwen3_moe": Qwen3MoeConfig,
    "mixtral": MixtralConfig,
    "deepseek_v2": DeepseekV2Config,
    "deepseek_v3": DeepseekV3Config,
    "smollm3": SmolLM3Config,
    "gemma4_text": Gemma4TextConfig,
    "mistral4": Mistral4Config,
    "glm4_moe": Glm4MoeConfig,
    "llama4_text": Llama4TextConfig,
}
# 4 experts, 2 per token, narrower than the dense MLP so a mixed-up width fails the shape check.
TINY_MOE = {"num_experts_per_tok": 2, "moe_intermediate_size": 32}
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}
# Phi-4-mini's shape in miniature: 3/4 of each head turns, longrope with distinct short and long lists
# (head_dim 16 -> 12 rotary dims -> 6 factors); the tests stay below the original length (64).
PHI3_LONGROPE = {
    "rope_type": "longrope",
    "rope_theta": 10000.0,
    "short_factor": [1.0, 1.1, 1.3, 1.7, 2.5, 4.0],
    "long_factor": [1.0, 1.5, 2.8, 5.0, 9.0, 16.0],
}
# Ministral 3's rope settings (yarn, q temperature) with a pretraining length of 8, so the q scale
# 1 + beta * log(1 + floor(position / 8)) changes every 8 tokens of the test prompts.
MINISTRAL3_ROPE = {
    "rope_type": "yarn",
    "rope_theta": 1_000_000.0,
    "factor": 16.0,
    "original_max_position_embeddings": 8,
    "max_position_embeddings": 512,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "llama_4_scaling_beta": 0.1,
}
# DeepSeek MLA in miniature: head = 16 nope + 8 rope dims, values 12 wide (the cache pads them), latent 32;
# layer 0 dense (first_k_dense_replace), layer 1 four routed experts + one shared.
TINY_DEEPSEEK = {
    "num_key_value_heads": 4,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 12,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
}
# DeepSeek-V2's yarn: mscale == mscale_all_dim, so cos/sin stay unscaled and the softmax scale takes mscale².
DEEPSEEK_YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 128,
    "mscale": 0.707,
    "mscale_all_dim": 0.707,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
}
# name -> (model_type, config overrides)
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("llama", {}),
    "llama3-rope": ("llama", {"rope_parameters": LLAMA3_ROPE}),
    "llama-tied": ("llama", {"tie_word_embeddings": True}),
    # A window shorter than the test prompts (up to 33 tokens), so it changes every later logit.
    "mistral": ("mistral", {"sliding_window": 8}),
    "qwen2": ("qwen2", {"rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0}}),
    "qwen3": ("qwen3", {"head_dim": 32, "tie_word_embeddings": True}),
    # Layer 0 slides (window 8), layer 1 is global; caps low enough that tanh bends the scores; a
    # query_pre_attn_scalar other than head_dim so the score scale is checked.
    "gemma2": (
        "gemma2",
        {
            "head_dim": 16,
            "sliding_window": 8,
            "query_pre_attn_scalar": 24,
            "attn_logit_softcapping": 2.0,
            "final_logit_softcapping": 5.0,
        },
    ),
    "gemma3": (
        "gemma3_text",
        {
            "head_dim": 16,
            "sliding_window": 8,
            "query_pre_attn_scalar": 24,
            "layer_types": ["sliding_attention", "full_attention"],
            "rope_parameters": {
                "full_attention": {"rope_type": "linear", "rope_theta": 1_000_000.0, "factor": 2.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            },
            "final_logit_softcapping": 5.0,
        },
    ),
    "phi3": ("phi3", {}),
    "phi3-partial-longrope": (
        "phi3",
        {
            "partial_rotary_factor": 0.75,
            "original_max_position_embeddings": 64,
            "rope_parameters": PHI3_LONGROPE,
            "tie_word_embeddings": True,
        },
    ),
    "ministral-yarn-rope": (
        "ministral",
        {
            "head_dim": 16,
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 1_000_000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 128,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
            },
        },
    ),
    "ministral3": ("ministral3", {"head_dim": 16, "rope_parameters": MINISTRAL3_ROPE}),
    # A strong temperature, tied embeddings (Ministral-3-3B ties them), and a sliding window.
    "ministral3-hot-tied": (
        "ministral3",
        {
            "rope_parameters": {**MINISTRAL3_ROPE, "llama_4_scaling_beta": 1.0},
            "tie_word_embeddings": True,
            "sliding_window": 8,
        },
    ),
    "llama-linear-rope": (
        "llama",
        {"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}},
    ),
    "qwen2-yarn-rope": (
        "qwen2",
        {
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 128,
            }
        },
    ),
    # Layer 1 keeps a dense MLP (mlp_only_layers): both kinds of layer in one model.
    "qwen3_moe": (
        "qwen3_moe",
        {**TINY_MOE, "num_experts": 4, "norm_topk_prob": True, "mlp_only_layers": [1], "head_dim": 32},
    ),
    # Raw top-k probabilities (no renormalisation); decoder_sparse_step 2 makes layer 0 dense.
    "qwen3_moe-sparse-step": (
        "qwen3_moe",
        {**TINY_MOE, "num_experts": 4, "norm_topk_prob": False, "decoder_sparse_step": 2},
    ),
    "mixtral": ("mixtral", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    # V2-Lite's shape: one q_proj, greedy softmax routing.
    "deepseek_v2-lite": ("deepseek_v2", {**TINY_DEEPSEEK, "q_lora_rank": None}),
    # V2's: low-rank q, group-limited routing (2 groups, 1 kept), scaled weights, biases, yarn + mscale².
    "deepseek_v2": (
        "deepseek_v2",
        {
            **TINY_DEEPSEEK,
            "q_lora_rank": 24,
            "topk_method": "group_limited_greedy",
            "n_group": 2,
            "topk_group": 1,
            "routed_scaling_factor": 2.0,
            "attention_bias": True,
            "rope_parameters": DEEPSEEK_YARN,
        },
    ),
    # V3's: sigmoid router with a (randomised) choice bias, groups ranked by their two best scores.
    "deepseek_v3": (
        "deepseek_v3",
        {**TINY_DEEPSEEK, "q_lora_rank": 24, "n_group": 2, "topk_group": 1, "routed_scaling_factor": 2.5},
    ),
    # Rotary halves instead of pairs, and values wider than keys (the cache pads q and k instead).
    "deepseek_v3-halves": (
        "deepseek_v3",
        {
            **TINY_DEEPSEEK,
            "q_lora_rank": None,
            "rope_interleave": False,
            "v_head_dim": 32,
            "n_group": 1,
            "topk_group": 1,
        },
    ),
}


def tiny_hf_model(model_type: str, seed: int = 0, **overrides: Any) -> torch.nn.Module:
    """hidden 64, 2 layers, 4 heads / 2 KV heads, vocab 256; weights drawn wide enough to make greedy
    choices clear-cut, norms and biases randomised too so a mis-mapped weight changes the output."""
    args: dict[str, Any] = {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 256,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
    }
    args.update(overrides)
    config = CONFIGS[model_type](**args)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            else:
                param.copy_(0.15 * torch.randn_like(param))
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # DeepSeek-V3's router bias: a buffer
                buffer.copy_(0.1 * torch.randn_like(buffer))
    return model


def bundle_from_hf(model: torch.nn.Module, name: str = "tiny") -> ModelBundle:
    config = ModelConfig.from_hf_dict(model.config.to_dict())
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def iter_weights() -> Iterator[WeightTensor]:
        for key, tensor in state.items():
            yield WeightTensor(key, tuple(tensor.shape), "F32", tensor.numpy())

    return ModelBundle(name, Path(name), "safetensors", config, iter_weights, tokenizer=None)  # type: ignore[arg-type]


# benchmarks/gpu_check.sh runs the parity suite on CUDA with LOCALCHAT_TEST_DEVICE=cuda.
TEST_DEVICE = os.environ.get("LOCALCHAT_TEST_DEVICE", "cpu")


@contextmanager
def exact_weights() -> Iterator[None]:
    """Loads inside dequantize GGUF blocks (LOCALCHAT_TORCH_QUANT=dequant): with float32 compute `auto`
    runs them on localchat's kernels with 8-bit activations, outside the float32 parity bounds."""
    before = os.environ.get(QUANT_ENV)
    os.environ[QUANT_ENV] = "dequant"
    try:
        yield
    finally:
        if before is None:
            del os.environ[QUANT_ENV]
        else:
            os.environ[QUANT_ENV] = before


def fp32_runner(bundle: ModelBundle, seed: int = 0) -> TorchRunner:
    """The exact path the parity tests compare with transformers: float32, GGUF blocks dequantized."""
    with exact_weights():
        return TorchRunner(bundle, RunnerOptions(device=TEST_DEVICE, dtype="float32", seed=seed))
