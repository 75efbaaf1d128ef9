"""LFM2 and LFM2-MoE (Liquid's short-conv hybrids): checkpoint and GGUF names, config keys and derived
sizes, and the per-sequence conv state (for the RAM estimate, without torch). The backends compute them
in `models/lfm2.py`; ssm.py lists the registry entries.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from localchat.weights.tensors import WeightTensor

if TYPE_CHECKING:
    from localchat.weights.config import ModelConfig

LFM2_LAYER_WEIGHTS: dict[str, tuple[str, int, int]] = {
    "operator_norm.weight": ("attn_norm", 0, 1),
    "ffn_norm.weight": ("mlp_norm", 0, 1),
    "self_attn.q_proj.weight": ("qkv", 0, 3),
    "self_attn.k_proj.weight": ("qkv", 1, 3),
    "self_attn.v_proj.weight": ("qkv", 2, 3),
    "self_attn.out_proj.weight": ("o", 0, 1),
    "self_attn.q_layernorm.weight": ("q_norm", 0, 1),
    "self_attn.k_layernorm.weight": ("k_norm", 0, 1),
    "conv.in_proj.weight": ("in_proj", 0, 1),
    "conv.in_proj.bias": ("in_proj_bias", 0, 1),
    "conv.conv.weight": ("conv", 0, 1),
    "conv.conv.bias": ("conv_bias", 0, 1),
    "conv.out_proj.weight": ("out", 0, 1),
    "conv.out_proj.bias": ("out_bias", 0, 1),
    "feed_forward.w1.weight": ("gate_up", 0, 2),
    "feed_forward.w3.weight": ("gate_up", 1, 2),
    "feed_forward.w2.weight": ("down", 0, 1),
}
LFM2_MOE_LAYER_WEIGHTS: dict[str, tuple[str, int, int]] = {
    **LFM2_LAYER_WEIGHTS,
    "feed_forward.gate.weight": ("moe.router", 0, 1),
    "feed_forward.expert_bias": ("moe.score_bias", 0, 1),
    "feed_forward.experts.{e}.gate_up_proj": ("moe.experts.{e}.gate_up", 0, 1),
    "feed_forward.experts.{e}.down_proj": ("moe.experts.{e}.down", 0, 1),
    "feed_forward.experts.{e}.w1.weight": ("moe.experts.{e}.gate_up", 0, 2),
    "feed_forward.experts.{e}.w3.weight": ("moe.experts.{e}.gate_up", 1, 2),
    "feed_forward.experts.{e}.w2.weight": ("moe.experts.{e}.down", 0, 1),
}
LFM2_TOP_WEIGHTS = {"model.embedding_norm.weight": "norm"}
# transformers' Lfm2Config defaults. `layer_types` [] (not None): derive_sizes builds it.
LFM2_EXTRA_KEYS: dict[str, Any] = {
    "layer_types": [],
    "full_attn_idxs": None,
    "conv_L_cache": 3,
    "conv_bias": False,
    "norm_eps": 1e-5,
    "block_ff_dim": None,
    "block_auto_adjust_ff_dim": True,
    "block_ffn_dim_multiplier": 1.0,
    "block_multiple_of": 256,
}
# transformers' Lfm2MoeConfig defaults; its MLP widths are used as given (no block_* adjustment).
LFM2_MOE_EXTRA_KEYS: dict[str, Any] = {
    **LFM2_EXTRA_KEYS,
    "block_auto_adjust_ff_dim": False,
    "num_dense_layers": 2,
    "num_experts": 32,
    "num_experts_per_tok": 4,
    "moe_intermediate_size": 1792,
    "use_expert_bias": True,
    "routed_scaling_factor": 1.0,
    "norm_topk_prob": True,
}
LFM2_HF_DEFAULTS: dict[str, Any] = {"tie_word_embeddings": True, "rope_theta": 1_000_000.0}
# llama.cpp's lfm2 blocks -> names inside `model.layers.N.` (its final norm is `token_embd_norm`).
LFM2_GGUF_BLOCK_NAMES: dict[str, str] = {
    "attn_norm": "operator_norm",
    "ffn_norm": "ffn_norm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.out_proj",
    "attn_q_norm": "self_attn.q_layernorm",
    "attn_k_norm": "self_attn.k_layernorm",
    "shortconv.conv": "conv.conv",
    "shortconv.in_proj": "conv.in_proj",
    "shortconv.out_proj": "conv.out_proj",
    "ffn_gate": "feed_forward.w1",
    "ffn_up": "feed_forward.w3",
    "ffn_down": "feed_forward.w2",
}
# The per-layer KV head counts (0: a conv layer) give the layer kinds; feed_forward_length is already
# the adjusted MLP width.
LFM2_GGUF_METADATA: dict[str, str] = {
    "attention.head_count_kv": "gguf_kv_heads",
    "shortconv.l_cache": "conv_L_cache",
    "attention.layer_norm_rms_epsilon": "norm_eps",
}


def lfm2_derive_sizes(config: ModelConfig) -> None:
    """Layer kinds from full_attn_idxs, eps from norm_eps, and the MLP width LFM2 derives from its
    nominal one (2/3 of it, times the multiplier, rounded up to a multiple). Idempotent: the nominal
    width is kept in `block_ff_dim`, as a config may be rebuilt from the derived one."""
    x = config.extra
    if isinstance(x.get("gguf_kv_heads"), list):  # a GGUF
        x["layer_types"] = ["full_attention" if h else "conv" for h in x["gguf_kv_heads"]]
        x["block_auto_adjust_ff_dim"] = False
    if not x.get("layer_types"):
        idxs = x.get("full_attn_idxs")
        full = set(range(config.num_hidden_layers) if idxs is None else idxs)
        x["layer_types"] = [
            "full_attention" if i in full else "conv" for i in range(config.num_hidden_layers)
        ]
    config.rms_norm_eps = float(x["norm_eps"])
    if "num_dense_layers" in x:  # LFM2-MoE: the leading dense layers, in MoeSpec's terms
        x["first_k_dense_replace"] = int(x["num_dense_layers"])
    if x.get("block_ff_dim") is None:
        x["block_ff_dim"] = config.intermediate_size
    size = int(x["block_ff_dim"])
    if x.get("block_auto_adjust_ff_dim") and config.model_type == "lfm2":  # LFM2-MoE's widths are as given
        size = int(2 * size / 3)
        if x.get("block_ffn_dim_multiplier") is not None:
            size = int(x["block_ffn_dim_multiplier"] * size)
            multiple = int(x["block_multiple_of"])
            size = multiple * ((size + multiple - 1) // multiple)
    config.intermediate_size = size


def lfm2_sanitize(config: ModelConfig, weights: Iterable[WeightTensor]) -> Iterator[WeightTensor]:
    """llama.cpp stores the short conv's kernel squeezed to [channels, K]: back to [channels, 1, K]."""
    for w in weights:
        if w.name.endswith("conv.conv.weight") and len(w.shape) == 2:
            w = WeightTensor(w.name, (w.shape[0], 1, w.shape[1]), w.dtype, np.asarray(w.data)[:, None, :])
        yield w


def lfm2_state_bytes(config: ModelConfig, dtype_bytes: int = 2) -> int:
    """One sequence's state: each conv layer keeps its last K - 1 inputs (hidden wide, compute dtype)."""
    x = config.extra
    layers = sum(1 for t in x["layer_types"] if t == "conv")
    return layers * config.hidden_size * (int(x["conv_L_cache"]) - 1) * dtype_bytes
