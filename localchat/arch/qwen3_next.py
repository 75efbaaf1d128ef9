"""Qwen3.5's and Qwen3-Next's hybrid layout (gated DeltaNet + full attention): checkpoint names, config
keys, Qwen3-Next's grouped projections, and the per-sequence state (for the RAM estimate, without torch).

Backends compute it in `models/qwen3_next.py`; the registry entries (`qwen3_5_text`, `qwen3_5`, the
multimodal wrapper whose text LM we run, and `qwen3_next`) point here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from localchat.weights.hf_quant_blocks import RepackedLinear
from localchat.weights.ordered_blocks import ordered_columns
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
    # M-RoPE's split over (temporal, height, width) for Qwen3.5's pictures (backends/torch/mrope.py).
    "mrope_section": None,
    "mrope_interleaved": True,  # transformers' Qwen3.5 always interleaves; a GGUF does not record it
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

# llama.cpp's qwen35 / qwen35moe / qwen3next blocks -> names inside `model.layers.N.`. `ssm_a` holds
# -exp(A_log) and has no suffix; `ssm_dt.bias` is dt_bias; `gguf_sanitize` turns them back.
QWEN35_GGUF_BLOCK_NAMES: dict[str, str] = {
    "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_qkv": "linear_attn.in_proj_qkv",
    "attn_gate": "linear_attn.in_proj_z",
    "ssm_beta": "linear_attn.in_proj_b",
    "ssm_alpha": "linear_attn.in_proj_a",
    "ssm_ba": "linear_attn.in_proj_ba",  # Qwen3-Next: b|a stay grouped per key head, as in its checkpoint
    "ssm_a": "linear_attn.A_log",
    "ssm_dt": "linear_attn.dt",
    "ssm_conv1d": "linear_attn.conv1d",
    "ssm_norm": "linear_attn.norm",
    "ssm_out": "linear_attn.out_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.gate_proj",
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
    # The multi-token-prediction block (after the model's own): its fc and norms; `_from_gguf` names
    # the block's tensors `mtp.*` as in the checkpoint.
    "nextn.eh_proj": "nextn.eh_proj",
    "nextn.enorm": "nextn.enorm",
    "nextn.hnorm": "nextn.hnorm",
    "nextn.shared_head_norm": "nextn.shared_head_norm",
}
_GGUF_NEXTN = {
    "nextn.eh_proj.weight": "mtp.fc.weight",
    "nextn.enorm.weight": "mtp.pre_fc_norm_embedding.weight",
    "nextn.hnorm.weight": "mtp.pre_fc_norm_hidden.weight",
    "nextn.shared_head_norm.weight": "mtp.norm.weight",
}
# `{arch}.<key>` -> config key. `gguf_ssm_inner_size` (always written) also tells sanitize the tensors are
# in llama.cpp's form.
QWEN35_GGUF_METADATA: dict[str, str] = {
    "rope.dimension_sections": "mrope_section",  # [t, h, w, 0]: Qwen3.5's M-RoPE for pictures
    "ssm.conv_kernel": "linear_conv_kernel_dim",
    "ssm.state_size": "linear_key_head_dim",
    "ssm.group_count": "linear_num_key_heads",
    "ssm.time_step_rank": "linear_num_value_heads",
    "ssm.inner_size": "gguf_ssm_inner_size",
    "attention.recurrent_layers": "gguf_recurrent_layers",
    "full_attention_interval": "full_attention_interval",
    "nextn_predict_layers": "gguf_nextn_layers",
    "expert_count": "num_experts",
    "expert_used_count": "num_experts_per_tok",
    "expert_feed_forward_length": "moe_intermediate_size",
    "expert_shared_feed_forward_length": "shared_expert_intermediate_size",
}

# Qwen3_5ForConditionalGeneration: the text LM under model.language_model; the vision tower is not run.
# The multi-token-prediction head keeps its `mtp.` names: the model's load skips them (`without_mtp`), and
# `--speculative mtp` reads them (backends/torch/mtp_head.py).
QWEN3_5_PREFIXES: dict[str, str | None] = {
    "model.language_model.": "model.",
    "language_model.model.": "model.",
    "language_model.lm_head.": "lm_head.",
    "model.visual.": None,
    "visual.": None,
    "model.mtp.": "mtp.",
}
MTP_PREFIX = "mtp."


def without_mtp(weights: Iterable[WeightTensor]) -> Iterator[WeightTensor]:
    """The checkpoint's tensors but its multi-token-prediction head's (loaded apart, only when asked)."""
    return (w for w in weights if not w.name.startswith(MTP_PREFIX))


def mtp_weights(config: ModelConfig, weights: Iterable[WeightTensor]) -> Iterator[WeightTensor]:
    """The multi-token-prediction head's tensors under the checkpoint's `mtp.*` names: a folder's as
    stored, a GGUF's extra block through `_from_gguf` (backends/torch/mtp_head.py loads them)."""
    if config.extra.get("gguf_ssm_inner_size"):
        tiled = config.model_type != "qwen3_next"  # qwen35 / qwen35moe tile value heads (not in this block)
        weights = _from_gguf(config, weights, tiled_value_heads=tiled)
    return (w for w in weights if w.name.startswith(MTP_PREFIX))


def derive_sizes(config: ModelConfig) -> None:
    """Every `full_attention_interval`-th layer is full attention when the config lists no layer_types.
    A GGUF gives the value head width as the inner size, the layer kinds as a recurrent flag per block,
    and counts its multi-token-prediction blocks (not run) in block_count."""
    x = config.extra
    if x.get("gguf_nextn_layers"):
        config.num_hidden_layers -= int(x["gguf_nextn_layers"])
        x["gguf_mtp_layers"] = int(x["gguf_nextn_layers"])  # read by --speculative mtp (serving/mtp.py)
        x["gguf_nextn_layers"] = 0  # once: ModelConfig runs this after every construction
    if x.get("gguf_ssm_inner_size"):
        x["linear_value_head_dim"] = int(x["gguf_ssm_inner_size"]) // int(x["linear_num_value_heads"])
    if not x.get("layer_types") and x.get("gguf_recurrent_layers"):
        flags = x["gguf_recurrent_layers"][: config.num_hidden_layers]
        x["layer_types"] = ["linear_attention" if f else "full_attention" for f in flags]
    if not x.get("layer_types"):
        interval = int(x.get("full_attention_interval") or 4)
        x["layer_types"] = [
            "full_attention" if (i + 1) % interval == 0 else "linear_attention"
            for i in range(config.num_hidden_layers)
        ]


def sanitize_qwen3_5(config: ModelConfig, weights: Iterable[WeightTensor]) -> Iterator[WeightTensor]:
    """Qwen3.5 and Qwen3.5-MoE: only a GGUF needs rewriting (llama.cpp also tiles their value heads)."""
    if config.extra.get("gguf_ssm_inner_size"):
        return without_mtp(_from_gguf(config, weights, tiled_value_heads=True))
    return without_mtp(weights)


def sanitize(config: ModelConfig, weights: Iterable[WeightTensor]) -> Iterator[WeightTensor]:
    """Qwen3-Next's DeltaNet projections are grouped per key head ([q, k, v..., z...] and [b..., a...]
    for each); split them into Qwen3.5's in_proj_qkv / z / b / a rows, the layout the model files read.
    (llama.cpp's converter splits q|k|v|z itself but keeps b|a grouped.)"""
    x = config.extra
    if x.get("gguf_ssm_inner_size"):
        weights = _from_gguf(config, weights, tiled_value_heads=False)
    weights = without_mtp(weights)
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
            if isinstance(weight, RepackedLinear):  # an FP8 folder's Q8_0 rows (weights/hf_q8_blocks.py)
                yield replace(weight.take_rows(index), name=f"{prefix}{name}.weight")
                continue
            # Dense data is [out, in]; GGUF blocks are [out, bytes per row]: rows pick the same way.
            yield WeightTensor(
                f"{prefix}{name}.weight", (len(index), *weight.shape[1:]), weight.dtype, data[index]
            )


def _from_gguf(
    config: ModelConfig, weights: Iterable[WeightTensor], tiled_value_heads: bool
) -> Iterator[WeightTensor]:
    """Undo what llama.cpp's converter did to a checkpoint: A_log stored as -exp(A_log), dt_bias as
    `ssm_dt.bias`, the conv kernel squeezed to [channels, K], every RMSNorm weight but the gated one
    stored as 1 + w, and (qwen35 / qwen35moe) value heads reordered from grouped per key head
    [k0: v0..v(r-1), k1: ...] to tiled [v0: k0..k(nk-1), v1: ...]. Multi-token-prediction blocks
    (counted in block_count) get the checkpoint's `mtp.*` names (`without_mtp` drops them for the model)."""
    x = config.extra
    heads = (int(x["linear_num_key_heads"]), int(x["linear_num_value_heads"]))
    key_dim = heads[0] * int(x["linear_key_head_dim"])
    dv = int(x["linear_value_head_dim"])
    for w in weights:
        parts = w.name.split(".", 3)
        if parts[:2] == ["model", "layers"] and int(parts[2]) >= config.num_hidden_layers:
            mtp = (
                _GGUF_NEXTN.get(parts[3])
                or f"mtp.layers.{int(parts[2]) - config.num_hidden_layers}.{parts[3]}"
            )
            if (
                mtp.endswith("norm.weight")
                or mtp.endswith("norm_embedding.weight")
                or mtp.endswith("norm_hidden.weight")
            ):
                w = WeightTensor(mtp, w.shape, "F32", w.dequantize() - np.float32(1.0))  # stored as 1 + w
            else:
                w = replace(w, name=mtp)
            yield w
            continue
        name = w.name
        if name.endswith("linear_attn.A_log"):
            w = WeightTensor(name, w.shape, "F32", np.log(-w.dequantize()).astype(np.float32))
        elif name.endswith("linear_attn.dt.bias"):
            w = WeightTensor(name.replace("dt.bias", "dt_bias"), w.shape, w.dtype, w.data)
        elif name.endswith("linear_attn.conv1d.weight") and len(w.shape) == 2:
            w = WeightTensor(name, (w.shape[0], 1, w.shape[1]), w.dtype, np.asarray(w.data)[:, None, :])
        elif name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
            w = WeightTensor(name, w.shape, "F32", w.dequantize() - np.float32(1.0))
        yield _untile(w, heads, dv, key_dim) if tiled_value_heads and heads[0] != heads[1] else w


def _grouped_order(heads: tuple[int, int], width: int) -> np.ndarray:
    """For each position in grouped order (key head k, its j-th value head, d), its tiled position."""
    nk, nv = heads
    tiled_head = np.arange(nv // nk)[None, :] * nk + np.arange(nk)[:, None]  # [nk, r]
    return (tiled_head[:, :, None] * width + np.arange(width)[None, None, :]).reshape(-1)


def _untile(w: WeightTensor, heads: tuple[int, int], dv: int, key_dim: int) -> WeightTensor:
    """One tensor's value heads back in grouped order: rows, or out_proj's input columns."""
    if w.name.endswith(("in_proj_qkv.weight", "conv1d.weight")):  # q and k rows stay
        index = np.concatenate((np.arange(2 * key_dim), 2 * key_dim + _grouped_order(heads, dv)))
    elif w.name.endswith("in_proj_z.weight"):
        index = _grouped_order(heads, dv)
    elif w.name.endswith(("in_proj_b.weight", "in_proj_a.weight", "A_log", "dt_bias")):
        index = _grouped_order(heads, 1)
    elif w.name.endswith("linear_attn.out_proj.weight"):
        return _untile_columns(w, heads, dv)
    else:
        return w
    return WeightTensor(w.name, w.shape, w.dtype, np.asarray(w.data)[index])


def _untile_columns(w: WeightTensor, heads: tuple[int, int], dv: int) -> WeightTensor:
    """Quantized rows move whole blocks when a value head is whole blocks wide; otherwise (Qwen3.5's
    128-wide heads in 256-value K-quant blocks) the blocks stay as stored and carry the column order
    (weights/ordered_blocks.py: the backend moves the activations instead)."""
    if not w.is_quantized:
        return WeightTensor(w.name, w.shape, w.dtype, np.asarray(w.data)[:, _grouped_order(heads, dv)])
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    block, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType[w.dtype]]
    if dv % block:
        return ordered_columns(w, _grouped_order(heads, dv))
    blocks = np.asarray(w.data).reshape(w.shape[0], -1, nbytes)[:, _grouped_order(heads, dv // block)]
    return WeightTensor(w.name, w.shape, w.dtype, blocks.reshape(w.shape[0], -1))


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
