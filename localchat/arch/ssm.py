"""Hybrid state-space families (LFM2's short conv; Mamba-2 in Granite 4.0-H and Nemotron-H): checkpoint
names, config keys, and the per-sequence state (for the RAM estimate, without torch). Backends compute
them in `models/lfm2.py` and `models/mamba_hybrid.py`; `entries` lists the registry entries.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

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
LFM2_HF_DEFAULTS: dict[str, Any] = {"tie_word_embeddings": True, "rope_theta": 1_000_000.0}


def lfm2_derive_sizes(config: ModelConfig) -> None:
    """Layer kinds from full_attn_idxs, eps from norm_eps, and the MLP width LFM2 derives from its
    nominal one (2/3 of it, times the multiplier, rounded up to a multiple). Idempotent: the nominal
    width is kept in `block_ff_dim`, as a config may be rebuilt from the derived one."""
    x = config.extra
    if not x.get("layer_types"):
        idxs = x.get("full_attn_idxs")
        full = set(range(config.num_hidden_layers) if idxs is None else idxs)
        x["layer_types"] = [
            "full_attention" if i in full else "conv" for i in range(config.num_hidden_layers)
        ]
    config.rms_norm_eps = float(x["norm_eps"])
    if x.get("block_ff_dim") is None:
        x["block_ff_dim"] = config.intermediate_size
    size = int(x["block_ff_dim"])
    if x.get("block_auto_adjust_ff_dim"):
        size = int(2 * size / 3)
        if x.get("block_ffn_dim_multiplier") is not None:
            size = int(x["block_ffn_dim_multiplier"] * size)
            multiple = int(x["block_multiple_of"])
            size = multiple * ((size + multiple - 1) // multiple)
    config.intermediate_size = size


def lfm2_state_bytes(config: ModelConfig, dtype_bytes: int = 2) -> int:
    """One sequence's state: each conv layer keeps its last K - 1 inputs (hidden wide, compute dtype)."""
    x = config.extra
    layers = sum(1 for t in x["layer_types"] if t == "conv")
    return layers * config.hidden_size * (int(x["conv_L_cache"]) - 1) * dtype_bytes


def entries(make: Callable[..., Any]) -> list[Any]:
    """The registry entries (`make` is registry.Architecture)."""
    lfm2 = make(
        "lfm2",
        "lfm2",
        layer_weights=LFM2_LAYER_WEIGHTS,
        hf_defaults=LFM2_HF_DEFAULTS,
        extra_keys=LFM2_EXTRA_KEYS,
        derive_sizes=lfm2_derive_sizes,
        top_weights=LFM2_TOP_WEIGHTS,
        state_bytes=lfm2_state_bytes,
    )
    return [lfm2]
