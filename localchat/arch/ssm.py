"""Hybrid state-space families: Mamba-2 in Granite 4.0-H and Nemotron-H (checkpoint names, config keys,
and the per-sequence state for the RAM estimate, without torch; computed in `models/mamba_hybrid.py`),
and `entries`, the registry entries of these and of LFM2's short-conv models (arch/lfm2.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from localchat.arch.lfm2 import (
    LFM2_EXTRA_KEYS,
    LFM2_GGUF_BLOCK_NAMES,
    LFM2_GGUF_METADATA,
    LFM2_HF_DEFAULTS,
    LFM2_LAYER_WEIGHTS,
    LFM2_MOE_EXTRA_KEYS,
    LFM2_MOE_LAYER_WEIGHTS,
    LFM2_TOP_WEIGHTS,
    lfm2_derive_sizes,
    lfm2_sanitize,
    lfm2_state_bytes,
)
from localchat.errors import ModelLoadError
from localchat.weights.tensors import WeightTensor

if TYPE_CHECKING:
    from localchat.weights.config import ModelConfig


# Mamba-2 mixers inside `model.layers.N.` (Granite: `mamba.`; Nemotron-H: `mixer.`), in mamba2.py's names.
def _mamba2_weights(prefix: str) -> dict[str, tuple[str, int, int]]:
    names = {
        "in_proj.weight": "in_proj",
        "in_proj.bias": "in_proj_bias",
        "conv1d.weight": "conv",
        "conv1d.bias": "conv_bias",
        "dt_bias": "dt_bias",
        "A_log": "A_log",
        "D": "D",
        "norm.weight": "gated_norm",
        "out_proj.weight": "out",
        "out_proj.bias": "out_bias",
    }
    return {f"{prefix}{k}": (f"mamba.{v}", 0, 1) for k, v in names.items()}


# The decay and skip parameters stay float32 (transformers computes the scan in float32).
MAMBA2_FLOAT32 = frozenset({"A_log", "dt_bias", "D"})

GRANITE_LAYER_WEIGHTS: dict[str, tuple[str, int, int]] = {
    **_mamba2_weights("mamba."),
    "input_layernorm.weight": ("attn_norm", 0, 1),
    "post_attention_layernorm.weight": ("mlp_norm", 0, 1),
    "self_attn.q_proj.weight": ("qkv", 0, 3),
    "self_attn.k_proj.weight": ("qkv", 1, 3),
    "self_attn.v_proj.weight": ("qkv", 2, 3),
    "self_attn.o_proj.weight": ("o", 0, 1),
    "shared_mlp.input_linear.weight": ("gate_up", 0, 1),
    "shared_mlp.output_linear.weight": ("down", 0, 1),
    "block_sparse_moe.router.layer.weight": ("moe.router", 0, 1),
    "block_sparse_moe.router.weight": ("moe.router", 0, 1),
    "block_sparse_moe.experts.{e}.gate_up_proj": ("moe.experts.{e}.gate_up", 0, 1),
    "block_sparse_moe.experts.{e}.down_proj": ("moe.experts.{e}.down", 0, 1),
}
# transformers' GraniteMoeHybridConfig defaults.
GRANITE_EXTRA_KEYS: dict[str, Any] = {
    "layer_types": [],
    "layers_block_type": None,
    "mamba_n_heads": 128,
    "mamba_n_groups": 1,
    "mamba_d_state": 256,
    "mamba_d_head": "auto",
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_conv_bias": True,
    "mamba_proj_bias": False,
    "embedding_multiplier": 1.0,
    "logits_scaling": 1.0,
    "residual_multiplier": 1.0,
    "attention_multiplier": 1.0,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "norm_topk_prob": True,  # softmax over the top-k logits: the renormalised top-k probabilities
    "shared_intermediate_size": 1024,
    "position_embedding_type": None,
    "time_step_limit": None,
    "block_kinds": [],
    "ssm": {},
}


def granite_derive_sizes(config: ModelConfig) -> None:
    """Layer kinds ("mamba" / "linear_attention" are Mamba-2; all layers Mamba-2 when none are listed)
    and the Mamba-2 sizes in the shared `ssm` form."""
    x = config.extra
    if (kinds := _gguf_block_kinds(x)) is not None:
        x["layer_types"] = kinds
        x["mamba_d_head"] = int(x["gguf_ssm_inner_size"]) // int(x["mamba_n_heads"])
        x["position_embedding_type"] = "rope" if x.get("gguf_use_rope") else None
    types = x.get("layer_types") or x.get("layers_block_type") or ["mamba"] * config.num_hidden_layers
    x["block_kinds"] = ["mamba" if t in ("mamba", "linear_attention") else "attention" for t in types]
    heads = int(x["mamba_n_heads"])
    inner = int(x["mamba_expand"]) * config.hidden_size
    head_dim = inner // heads if x["mamba_d_head"] == "auto" else int(x["mamba_d_head"])
    x["ssm"] = {
        "heads": heads,
        "head_dim": head_dim,
        "groups": int(x["mamba_n_groups"]),
        "d_state": int(x["mamba_d_state"]),
        "conv_kernel": int(x["mamba_d_conv"]),
        "conv_bias": bool(x["mamba_conv_bias"]),
        "proj_bias": bool(x["mamba_proj_bias"]),
        "dt_min": float((x.get("time_step_limit") or [0.0])[0]),
    }


def granite_sanitize(config: ModelConfig, weights: Iterable[WeightTensor]) -> Iterator[WeightTensor]:
    """The hub's stacked experts (`block_sparse_moe.input_linear` [E, 2I, H], `output_linear`) under
    transformers 5's names, which weights/experts.py splits per expert."""
    for w in weights:
        name = w.name.replace("block_sparse_moe.input_linear.weight", "block_sparse_moe.experts.gate_up_proj")
        name = name.replace("block_sparse_moe.output_linear.weight", "block_sparse_moe.experts.down_proj")
        yield w if name == w.name else WeightTensor(name, w.shape, w.dtype, w.data)


# llama.cpp's Mamba-2 tensors (`ssm_a` holds -exp(A_log), `ssm_a` / `ssm_d` are [H, 1], the gated norm
# [groups, inner / groups], the conv squeezed; `mamba2_gguf_sanitize` turns them back).
def _mamba2_gguf_names(prefix: str) -> dict[str, str]:
    names = {"ssm_in": "in_proj", "ssm_conv1d": "conv1d", "ssm_dt": "dt", "ssm_a": "A_log", "ssm_d": "D",
             "ssm_norm": "norm", "ssm_out": "out_proj"}  # fmt: skip
    return {k: f"{prefix}{v}" for k, v in names.items()}


# The per-layer KV head counts (0: no attention) give the layer kinds; the inner size gives the head width.
_MAMBA2_GGUF_METADATA = {"attention.head_count_kv": "gguf_kv_heads", "ssm.inner_size": "gguf_ssm_inner_size"}
GRANITE_GGUF_BLOCK_NAMES: dict[str, str] = {
    **_mamba2_gguf_names("mamba."),
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate_inp": "block_sparse_moe.router.layer",
    "ffn_gate_exps": "block_sparse_moe.experts.gate_proj",
    "ffn_up_exps": "block_sparse_moe.experts.up_proj",
    "ffn_down_exps": "block_sparse_moe.experts.down_proj",
    "ffn_gate_shexp": "shared_mlp.gate_proj",
    "ffn_up_shexp": "shared_mlp.up_proj",
    "ffn_down_shexp": "shared_mlp.output_linear",
    "ffn_gate": "shared_mlp.gate_proj",  # a model without experts: the shared MLP is the MLP
    "ffn_up": "shared_mlp.up_proj",
    "ffn_down": "shared_mlp.output_linear",
}
GRANITE_GGUF_METADATA: dict[str, str] = {
    **_MAMBA2_GGUF_METADATA,
    "ssm.conv_kernel": "mamba_d_conv",
    "ssm.state_size": "mamba_d_state",
    "ssm.group_count": "mamba_n_groups",
    "ssm.time_step_rank": "mamba_n_heads",
    "attention.scale": "attention_multiplier",
    "embedding_scale": "embedding_multiplier",
    "residual_scale": "residual_multiplier",
    "logit_scale": "logits_scaling",
    "expert_count": "num_local_experts",
    "expert_used_count": "num_experts_per_tok",
    "expert_shared_feed_forward_length": "shared_intermediate_size",
    "rope.scaling.finetuned": "gguf_use_rope",  # llama.cpp's granitehybrid turns RoPE on by this flag
}
NEMOTRON_H_GGUF_BLOCK_NAMES: dict[str, str] = {
    **_mamba2_gguf_names("mixer."),
    "attn_norm": "norm",
    "attn_q": "mixer.q_proj",
    "attn_k": "mixer.k_proj",
    "attn_v": "mixer.v_proj",
    "attn_output": "mixer.o_proj",
    "ffn_up": "mixer.up_proj",
    "ffn_down": "mixer.down_proj",
}
# The per-layer MLP widths (0: no MLP) give the MLP blocks.
NEMOTRON_H_GGUF_METADATA: dict[str, str] = {
    **_MAMBA2_GGUF_METADATA,
    "feed_forward_length": "gguf_ff_lengths",
    "ssm.conv_kernel": "conv_kernel",
    "ssm.state_size": "ssm_state_size",
    "ssm.group_count": "n_groups",
    "ssm.time_step_rank": "mamba_num_heads",
    "attention.layer_norm_epsilon": "layer_norm_epsilon",
}


def mamba2_gguf_sanitize(config: ModelConfig, weights: Iterable[WeightTensor]) -> Iterator[WeightTensor]:
    """A GGUF's Mamba-2 tensors back in the checkpoint's form: A_log = log(-A), A and D as [H], dt_bias,
    the conv kernel [C, 1, K], the gated norm flat; the hub layout's stacked experts (granite_sanitize)."""
    if not config.extra.get("gguf_ssm_inner_size"):
        yield from (granite_sanitize(config, weights) if config.model_type == "granitemoehybrid" else weights)
        return
    waiting: dict[str, WeightTensor] = {}  # a gate matrix until its up matrix arrives
    for w in weights:
        name = w.name
        if (split := _split_part(name)) is not None:
            fused_name, is_gate = split
            other = waiting.pop(fused_name, None)
            if other is None:
                waiting[fused_name] = w
                continue
            yield _rows_joined(fused_name, *((w, other) if is_gate else (other, w)))
            continue
        if name.endswith(".block_sparse_moe.experts.down_proj.weight"):
            w = WeightTensor(name.removesuffix(".weight"), w.shape, w.dtype, w.data)
        elif name.endswith((".mamba.A_log", ".mixer.A_log")):
            w = WeightTensor(
                name, (w.shape[0],), "F32", np.log(-w.dequantize()).reshape(-1).astype(np.float32)
            )
        elif name.endswith((".mamba.D", ".mixer.D")):
            w = WeightTensor(name, (w.shape[0],), "F32", w.dequantize().reshape(-1))
        elif name.endswith(".dt.bias"):
            w = WeightTensor(name.removesuffix(".dt.bias") + ".dt_bias", w.shape, w.dtype, w.data)
        elif name.endswith("conv1d.weight") and len(w.shape) == 2:
            w = WeightTensor(name, (w.shape[0], 1, w.shape[1]), w.dtype, np.asarray(w.data)[:, None, :])
        elif name.endswith((".mamba.norm.weight", ".mixer.norm.weight")) and len(w.shape) == 2:
            w = WeightTensor(name, (w.shape[0] * w.shape[1],), "F32", w.dequantize().reshape(-1))
        yield w


# Granite's gate|up matrices, which llama.cpp's converter splits: gate suffix -> (up suffix, fused name).
_GRANITE_SPLIT = {
    "shared_mlp.gate_proj.weight": ("shared_mlp.up_proj.weight", "shared_mlp.input_linear.weight"),
    "block_sparse_moe.experts.gate_proj.weight": (
        "block_sparse_moe.experts.up_proj.weight",
        "block_sparse_moe.experts.gate_up_proj",
    ),
}


def _split_part(name: str) -> tuple[str, bool] | None:
    """(the fused matrix's name, whether this is its gate part) for one of Granite's split matrices."""
    for gate, (up, fused) in _GRANITE_SPLIT.items():
        for suffix, is_gate in ((gate, True), (up, False)):
            if name.endswith(suffix):
                return name.removesuffix(suffix) + fused, is_gate
    return None


def _rows_joined(name: str, gate: WeightTensor, up: WeightTensor) -> WeightTensor:
    """gate rows then up rows, per expert for stacked [E, I, H] tensors. Quantized rows are joined as
    they are (whole rows of blocks); two different types are dequantized first."""
    if gate.dtype != up.dtype:
        gate, up = (WeightTensor(t.name, t.shape, "F32", t.dequantize()) for t in (gate, up))
    experts = gate.shape[0] if len(gate.shape) == 3 else 1
    a = np.asarray(gate.data).reshape(experts, gate.shape[-2], -1)
    b = np.asarray(up.data).reshape(experts, up.shape[-2], -1)
    rows = gate.shape[-2] + up.shape[-2]
    shape = (*gate.shape[:-2], rows, gate.shape[-1])
    data = np.concatenate((a, b), axis=1)
    data = data.reshape(shape) if not gate.is_quantized else data.reshape(experts * rows, -1)
    return WeightTensor(name, shape, gate.dtype, data)


def _gguf_block_kinds(x: dict[str, Any]) -> list[str] | None:
    """A GGUF's layer kinds from its per-layer counts (attention: KV heads; Nemotron-H's MLP: a width)."""
    kv = x.get("gguf_kv_heads")
    if not isinstance(kv, list):
        return None
    ff = x.get("gguf_ff_lengths")
    ff = ff if isinstance(ff, list) else [0] * len(kv)
    return ["attention" if h else "mlp" if f else "mamba" for h, f in zip(kv, ff, strict=True)]


def mamba2_state_bytes(config: ModelConfig, dtype_bytes: int = 2) -> int:
    """One sequence's state over the Mamba-2 layers: the conv window (K - 1 inputs of x|B|C, compute
    dtype) and the float32 state [heads, head_dim, d_state]."""
    s = config.extra["ssm"]
    layers = sum(1 for k in config.extra["block_kinds"] if k == "mamba")
    channels = s["heads"] * s["head_dim"] + 2 * s["groups"] * s["d_state"]
    conv = channels * (s["conv_kernel"] - 1) * dtype_bytes
    return layers * (conv + s["heads"] * s["head_dim"] * s["d_state"] * 4)


NEMOTRON_H_LAYER_WEIGHTS: dict[str, tuple[str, int, int]] = {
    **_mamba2_weights("mixer."),
    "norm.weight": ("attn_norm", 0, 1),
    "mixer.q_proj.weight": ("qkv", 0, 3),
    "mixer.k_proj.weight": ("qkv", 1, 3),
    "mixer.v_proj.weight": ("qkv", 2, 3),
    "mixer.o_proj.weight": ("o", 0, 1),
    "mixer.up_proj.weight": ("up", 0, 1),
    "mixer.down_proj.weight": ("down", 0, 1),
}
NEMOTRON_H_TOP_WEIGHTS = {"model.embeddings.weight": "embed", "model.norm_f.weight": "norm"}
# The hub's checkpoints keep the model under `backbone.`; multi-token-prediction layers are not run.
NEMOTRON_H_PREFIXES: dict[str, str | None] = {"backbone.": "model.", "mtp.": None}
# transformers 5 writes no num_hidden_layers (the block list gives it): derive_sizes sets it.
NEMOTRON_H_HF_DEFAULTS: dict[str, Any] = {
    "num_hidden_layers": 0,
    "head_dim": 128,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 21504,
}
# transformers' NemotronHConfig defaults.
NEMOTRON_H_EXTRA_KEYS: dict[str, Any] = {
    "layers_block_type": None,  # (no `layer_types` key: ModelConfig would fill it with attention layers)
    "hybrid_override_pattern": None,
    "mamba_num_heads": 128,
    "mamba_head_dim": 64,
    "ssm_state_size": 128,
    "n_groups": 8,
    "conv_kernel": 4,
    "use_conv_bias": True,
    "use_bias": False,
    "time_step_min": 0.001,
    "layer_norm_epsilon": 1e-5,
    "block_kinds": [],
    "ssm": {},
}
# hybrid_override_pattern's letters; "E" (MoE blocks, Nemotron 3) is not supported yet.
_PATTERN = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
_NEMOTRON_KINDS = {
    "mamba": "mamba",
    "linear_attention": "mamba",
    "attention": "attention",
    "full_attention": "attention",
    "mlp": "mlp",
    "moe": "moe",
}


def nemotron_h_derive_sizes(config: ModelConfig) -> None:
    """Block kinds from layers_block_type (or the older hybrid_override_pattern string), eps from
    layer_norm_epsilon, and the Mamba-2 sizes in the shared `ssm` form."""
    x = config.extra
    if (kinds := _gguf_block_kinds(x)) is not None:
        x["layers_block_type"] = kinds
        x["mamba_head_dim"] = int(x["gguf_ssm_inner_size"]) // int(x["mamba_num_heads"])
    types = x.get("layers_block_type")
    if not types and x.get("hybrid_override_pattern"):
        types = [_PATTERN[ch] for ch in x["hybrid_override_pattern"]]
    if types:
        kinds = [_NEMOTRON_KINDS[t] for t in types]
        if "moe" in kinds:
            raise ModelLoadError(
                "This Nemotron-H model has mixture-of-experts blocks (Nemotron 3), which are not supported yet."
            )
        x["block_kinds"] = kinds
        config.num_hidden_layers = len(kinds)
    config.rms_norm_eps = float(x["layer_norm_epsilon"])
    x["ssm"] = {
        "heads": int(x["mamba_num_heads"]),
        "head_dim": int(x["mamba_head_dim"]),
        "groups": int(x["n_groups"]),
        "d_state": int(x["ssm_state_size"]),
        "conv_kernel": int(x["conv_kernel"]),
        "conv_bias": bool(x["use_conv_bias"]),
        "proj_bias": bool(x["use_bias"]),
        "dt_min": float(x["time_step_min"]),
    }


def entries(make: Callable[..., Any]) -> list[Any]:
    """The registry entries (`make` is architecture.Architecture)."""
    lfm2 = make(
        "lfm2",
        "lfm2",
        layer_weights=LFM2_LAYER_WEIGHTS,
        hf_defaults=LFM2_HF_DEFAULTS,
        extra_keys=LFM2_EXTRA_KEYS,
        derive_sizes=lfm2_derive_sizes,
        sanitize=lfm2_sanitize,
        top_weights=LFM2_TOP_WEIGHTS,
        state_bytes=lfm2_state_bytes,
        gguf_arch="lfm2",
        gguf_block_names=LFM2_GGUF_BLOCK_NAMES,
        gguf_metadata=LFM2_GGUF_METADATA,
    )
    lfm2_moe = make(
        "lfm2_moe",
        "lfm2",
        layer_weights=LFM2_MOE_LAYER_WEIGHTS,
        hf_defaults=LFM2_HF_DEFAULTS,
        extra_keys=LFM2_MOE_EXTRA_KEYS,
        derive_sizes=lfm2_derive_sizes,
        float32_params=frozenset({"score_bias"}),
        top_weights=LFM2_TOP_WEIGHTS,
        state_bytes=lfm2_state_bytes,
    )
    granite = make(
        "granitemoehybrid",
        "mamba_hybrid",
        layer_weights=GRANITE_LAYER_WEIGHTS,
        extra_keys=GRANITE_EXTRA_KEYS,
        derive_sizes=granite_derive_sizes,
        sanitize=mamba2_gguf_sanitize,
        float32_params=MAMBA2_FLOAT32,
        state_bytes=mamba2_state_bytes,
        gguf_arch="granitehybrid",
        gguf_block_names=GRANITE_GGUF_BLOCK_NAMES,
        gguf_metadata=GRANITE_GGUF_METADATA,
        gguf_permuted_qk=True,  # converted with llama.cpp's Llama script
    )
    nemotron_h = make(
        "nemotron_h",
        "mamba_hybrid",
        layer_weights=NEMOTRON_H_LAYER_WEIGHTS,
        hf_defaults=NEMOTRON_H_HF_DEFAULTS,
        extra_keys=NEMOTRON_H_EXTRA_KEYS,
        derive_sizes=nemotron_h_derive_sizes,
        float32_params=MAMBA2_FLOAT32,
        top_weights=NEMOTRON_H_TOP_WEIGHTS,
        weight_prefixes=NEMOTRON_H_PREFIXES,
        state_bytes=mamba2_state_bytes,
        sanitize=mamba2_gguf_sanitize,
        gguf_arch="nemotron_h",
        gguf_block_names=NEMOTRON_H_GGUF_BLOCK_NAMES,
        gguf_metadata=NEMOTRON_H_GGUF_METADATA,
        gguf_permuted_qk=True,  # converted with llama.cpp's Llama script (its attention has no RoPE)
    )
    return [lfm2, lfm2_moe, granite, nemotron_h]
