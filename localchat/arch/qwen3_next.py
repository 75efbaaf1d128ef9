"""Qwen3.5's and Qwen3-Next's hybrid layout (gated DeltaNet + full attention): checkpoint names, config
keys, Qwen3-Next's grouped projections, and the per-sequence state (for the RAM estimate, without torch).

Backends compute it in `models/qwen3_next.py`; the registry entries (`qwen3_5_text`, `qwen3_5`, the
multimodal wrapper whose text LM we run, and `qwen3_next`) point here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from localchat.weights.tensors import WeightTensor

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
# transformers' defaults; real configs give rope_theta and partial_rotary_factor (0.25) in rope_parameters.
QWEN3_5_HF_DEFAULTS: dict[str, Any] = {"head_dim": 256, "rope_theta": 10_000.0}
# Qwen3-Next: every layer's MLP is a sparse MoE with a sigmoid-gated shared expert (transformers' defaults).
QWEN3_NEXT_EXTRA_KEYS: dict[str, Any] = {
    **QWEN3_5_EXTRA_KEYS,
    "num_experts": 512,
    "num_experts_per_tok": 10,
    "norm_topk_prob": True,
    "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
}
# Qwen3.5-MoE: Qwen3.5's layers with Qwen3-Next's MoE (always renormalised top-k); transformers' defaults.
QWEN3_5_MOE_EXTRA_KEYS: dict[str, Any] = {
    **QWEN3_NEXT_EXTRA_KEYS,
    "num_experts": 256,
    "num_experts_per_tok": 8,
}
QWEN3_NEXT_SHARED_WEIGHTS: dict[str, tuple[str, int, int]] = {
    "mlp.shared_expert.gate_proj.weight": ("moe.shared.gate_up", 0, 2),
    "mlp.shared_expert.up_proj.weight": ("moe.shared.gate_up", 1, 2),
    "mlp.shared_expert.down_proj.weight": ("moe.shared.down", 0, 1),
    "mlp.shared_expert_gate.weight": ("moe.shared_gate", 0, 1),
}
_GROUPED = re.compile(r"(.*\.linear_attn\.)in_proj_(qkvz|ba)\.weight")

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


def sanitize(config: ModelConfig, weights: Iterable[WeightTensor]) -> Iterator[WeightTensor]:
    """Qwen3-Next's DeltaNet projections are grouped per key head ([q, k, v..., z...] and [b..., a...]
    for each); split them into Qwen3.5's in_proj_qkv / z / b / a rows, the layout the model files read."""
    x = config.extra
    nk, dk, dv = x["linear_num_key_heads"], x["linear_key_head_dim"], x["linear_value_head_dim"]
    r = x["linear_num_value_heads"] // nk  # value heads per key head
    group = 2 * dk + 2 * r * dv

    def rows(offset: int, size: int, stride: int) -> np.ndarray:
        return (np.arange(nk)[:, None] * stride + offset + np.arange(size)[None, :]).reshape(-1)

    for weight in weights:
        match = _GROUPED.fullmatch(weight.name)
        if match is None:
            yield weight
            continue
        prefix = match.group(1)
        if match.group(2) == "qkvz":
            parts = {
                "in_proj_qkv": np.concatenate(
                    (rows(0, dk, group), rows(dk, dk, group), rows(2 * dk, r * dv, group))
                ),
                "in_proj_z": rows(2 * dk + r * dv, r * dv, group),
            }
        else:
            parts = {"in_proj_b": rows(0, r, 2 * r), "in_proj_a": rows(r, r, 2 * r)}
        data = np.asarray(weight.data)
        for name, index in parts.items():
            # Dense data is [out, in]; GGUF blocks are [out, bytes per row]: rows pick the same way.
            yield WeightTensor(
                f"{prefix}{name}.weight", (len(index), *weight.shape[1:]), weight.dtype, data[index]
            )


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
