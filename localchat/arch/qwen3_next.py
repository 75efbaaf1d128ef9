"""Qwen3.5's hybrid layout (gated DeltaNet + full attention): checkpoint names, config keys, and the
per-sequence state it needs (for the RAM estimate, without torch).

Backends compute it in `models/qwen3_next.py`; the registry entries (`qwen3_5_text`, and `qwen3_5`, the
multimodal wrapper whose text LM we run) point here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from localchat.weights.config import ModelConfig

# Inside `model.layers.N.`: the full-attention layers' names (q_proj holds each head's query and its output
# gate), the linear-attention layers' (one fused input projection: q|k|v, z, b, a), and the shared MLP.
QWEN3_5_LAYER_WEIGHTS: dict[str, tuple[str, int, int]] = {
    "input_layernorm.weight": ("attn_norm", 0, 1),
    "post_attention_layernorm.weight": ("mlp_norm", 0, 1),
    "self_attn.q_proj.weight": ("qkv", 0, 3),
    "self_attn.k_proj.weight": ("qkv", 1, 3),
    "self_attn.v_proj.weight": ("qkv", 2, 3),
    "self_attn.o_proj.weight": ("o", 0, 1),
    "self_attn.q_norm.weight": ("q_norm", 0, 1),
    "self_attn.k_norm.weight": ("k_norm", 0, 1),
    "linear_attn.in_proj_qkv.weight": ("in_proj", 0, 4),
    "linear_attn.in_proj_z.weight": ("in_proj", 1, 4),
    "linear_attn.in_proj_b.weight": ("in_proj", 2, 4),
    "linear_attn.in_proj_a.weight": ("in_proj", 3, 4),
    "linear_attn.conv1d.weight": ("conv", 0, 1),
    "linear_attn.dt_bias": ("dt_bias", 0, 1),
    "linear_attn.A_log": ("A_log", 0, 1),
    "linear_attn.norm.weight": ("gated_norm", 0, 1),
    "linear_attn.out_proj.weight": ("out", 0, 1),
    "mlp.gate_proj.weight": ("gate_up", 0, 2),
    "mlp.up_proj.weight": ("gate_up", 1, 2),
    "mlp.down_proj.weight": ("down", 0, 1),
}
# The decay parameters stay float32 (transformers computes the decay in float32 too).
QWEN3_5_FLOAT32 = frozenset({"A_log", "dt_bias"})

# transformers' Qwen3_5TextConfig defaults. `layer_types` [] (not None): ModelConfig would otherwise fill
# it with the sliding-window alternation; `derive_sizes` builds it from full_attention_interval.
QWEN3_5_EXTRA_KEYS: dict[str, Any] = {
    "layer_types": [],
    "full_attention_interval": 4,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
}
QWEN3_5_HF_DEFAULTS: dict[str, Any] = {
    "head_dim": 256,
    "rope_theta": 10_000_000.0,
    "partial_rotary_factor": 0.25,
}

# Qwen3_5ForConditionalGeneration: the text LM under model.language_model; vision tower and the
# multi-token-prediction head are not run.
QWEN3_5_PREFIXES: dict[str, str | None] = {
    "model.language_model.": "model.",
    "language_model.model.": "model.",
    "language_model.lm_head.": "lm_head.",
    "model.visual.": None,
    "visual.": None,
    "mtp.": None,
}


def derive_sizes(config: ModelConfig) -> None:
    """Every `full_attention_interval`-th layer is full attention when the config lists no layer_types."""
    x = config.extra
    if not x.get("layer_types"):
        interval = int(x.get("full_attention_interval") or 4)
        x["layer_types"] = [
            "full_attention" if (i + 1) % interval == 0 else "linear_attention"
            for i in range(config.num_hidden_layers)
        ]


def state_bytes_per_sequence(config: ModelConfig, dtype_bytes: int = 2) -> int:
    """One sequence's state over all linear-attention layers: the conv window (K - 1 inputs of q|k|v, in
    the compute dtype) and the float32 recurrent matrix per value head."""
    x = config.extra
    layers = sum(1 for t in x["layer_types"] if t == "linear_attention")
    key_dim = x["linear_num_key_heads"] * x["linear_key_head_dim"]
    value_dim = x["linear_num_value_heads"] * x["linear_value_head_dim"]
    conv = (2 * key_dim + value_dim) * (x["linear_conv_kernel_dim"] - 1) * dtype_bytes
    recurrent = x["linear_num_value_heads"] * x["linear_key_head_dim"] * x["linear_value_head_dim"] * 4
    return layers * (conv + recurrent)
