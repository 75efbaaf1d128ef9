"""DeepSeek-V2 / V3 facts both backends share (backend-neutral): multi-head latent attention (MLA) sizes,
the shared-expert router, the paged cache shape, and `sanitize`, which brings Hugging Face and GGUF tensors
to one layout before a backend loads them.

MLA: q comes from `q_proj` (or the low-rank q_a_proj -> RMSNorm -> q_b_proj), one head = nope | rope dims;
`kv_a_proj_with_mqa` gives a latent (kv_lora_rank, RMSNorm'd) plus one rope key shared by all heads;
`kv_b_proj` expands the latent to each head's nope key | value. RoPE turns the rope dims only.
NOTE: the paged cache stores the expanded per-head keys (nope | rope) and values zero-padded to the key
width, so every attention path runs unchanged with kv_heads = heads. That costs heads * 2 * qk_dim per
token and layer where the latent alone would be kv_lora_rank + rope_dim (~85x less for DeepSeek-V3);
a latent cache with absorbed attention is the follow-up.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from localchat.errors import ModelLoadError
from localchat.weights.hf_quant_blocks import reorder_rows
from localchat.weights.tensors import WeightTensor

if TYPE_CHECKING:
    from localchat.weights.config import ModelConfig

# Latent RMSNorms (q_a_layernorm, kv_a_layernorm) use this eps whatever rms_norm_eps says (transformers).
LATENT_NORM_EPS = 1e-6
# llama.cpp's `expert_gating_func` values.
_GGUF_GATING = {1: "softmax", 2: "sigmoid"}


@dataclass(frozen=True, slots=True)
class MlaSpec:
    heads: int
    q_lora_rank: int | None  # None: one q_proj from the hidden state
    kv_lora_rank: int
    nope_dim: int
    rope_dim: int
    v_dim: int
    softmax_scale: float  # qk_dim ** -0.5, times mscale(factor, mscale_all_dim) ** 2 under yarn

    @property
    def qk_dim(self) -> int:
        return self.nope_dim + self.rope_dim

    @property
    def cache_dim(self) -> int:
        """The per-head width the paged cache stores for K and (zero-padded) V."""
        return max(self.qk_dim, self.v_dim)

    @classmethod
    def from_config(cls, config: ModelConfig) -> MlaSpec:
        x = config.extra
        nope, rope = int(x["qk_nope_head_dim"]), int(x["qk_rope_head_dim"])
        scale = (nope + rope) ** -0.5
        scaling: dict[str, Any] = config.rope_scaling or {}
        factor, m_all = float(scaling.get("factor") or 1.0), scaling.get("mscale_all_dim")
        if scaling.get("rope_type", "default") != "default" and m_all and factor > 1:
            scale *= (0.1 * float(m_all) * math.log(factor) + 1.0) ** 2
        q_rank = x.get("q_lora_rank")
        return cls(
            heads=config.num_attention_heads,
            q_lora_rank=int(q_rank) if q_rank else None,
            kv_lora_rank=int(x["kv_lora_rank"]),
            nope_dim=nope,
            rope_dim=rope,
            v_dim=int(x["v_head_dim"]),
            softmax_scale=scale,
        )


@dataclass(frozen=True, slots=True)
class RouterSpec:
    """How a DeepSeek MoE layer picks and weighs its routed experts.

    V2: softmax scores; `group_limited_greedy` keeps the `groups_used` groups with the best single score.
    V3: sigmoid scores plus a learned bias for choosing only (the weights are the unbiased scores); groups
    ranked by the sum of their two best biased scores. Weights then renormalised (if set) and scaled.
    """

    sigmoid: bool
    groups: int  # 1: no group limit
    groups_used: int
    renormalize: bool
    scale: float  # routed_scaling_factor

    @classmethod
    def from_config(cls, config: ModelConfig) -> RouterSpec:
        x = config.extra
        scoring = _GGUF_GATING.get(int(x.get("expert_gating_func") or 0), x.get("scoring_func") or "softmax")
        if scoring not in ("softmax", "sigmoid"):
            raise ModelLoadError(f"DeepSeek router scoring {scoring!r} is not supported (softmax, sigmoid).")
        groups = int(x.get("n_group") or 1)
        grouped = groups > 1 and x.get("topk_method") != "greedy"
        experts = int(x.get("n_routed_experts") or 0)
        sigmoid = scoring == "sigmoid"
        # V3 ranks groups by their two best scores: each group needs two experts.
        if grouped and (experts % groups or (sigmoid and experts // groups < 2)):
            raise ModelLoadError(
                f"{experts} routed experts do not split into {groups} groups; the model's config is damaged."
            )
        return cls(
            sigmoid=sigmoid,
            groups=groups if grouped else 1,
            groups_used=int(x.get("topk_group") or groups) if grouped else 1,
            renormalize=bool(x.get("norm_topk_prob")),
            scale=float(x.get("routed_scaling_factor") or 1.0),
        )


def derive_sizes(config: ModelConfig) -> None:
    """Attention sizes as the paged cache sees them: one cache head per query head, `cache_dim` wide;
    a GGUF file's head sizes under transformers' names. Idempotent (ModelConfig calls it after every
    construction)."""
    x = config.extra
    if x.get("gguf_key_length") is not None:
        mla_file = x.get("gguf_key_length_mla") is not None  # llama.cpp's MLA layout (2025 on)
        qk = x["gguf_key_length_mla"] if mla_file else x["gguf_key_length"]
        x["v_head_dim"] = x["gguf_value_length_mla"] if mla_file else x["gguf_value_length"]
        x["qk_nope_head_dim"] = int(qk) - int(x["qk_rope_head_dim"])
    mla = MlaSpec.from_config(config)
    config.num_key_value_heads = config.num_attention_heads
    config.head_dim = mla.cache_dim
    config.partial_rotary_factor = mla.rope_dim / mla.cache_dim  # the RoPE tables cover the rope dims


def sanitize(config: ModelConfig, weights: Iterable[WeightTensor]) -> Iterator[WeightTensor]:
    """Checkpoint tensors -> the layout the model files read:

    - rotary rows de-interleaved: DeepSeek (and llama.cpp's deepseek2 files) rotate (x0, x1) pairs; after
      reordering q's and the shared key's rope rows to evens | odds the usual rotate-half RoPE is exact;
    - llama.cpp's split `attn_k_b` [heads, kv_lora, nope] / `attn_v_b` [heads, v, kv_lora] merged back into
      kv_b_proj [heads * (nope + v), kv_lora] (dequantized: k_b is stored transposed);
    - multi-token-prediction layers (past num_hidden_layers, DeepSeek-V3) dropped: we do not run them.
    """
    mla = MlaSpec.from_config(config)
    interleaved = bool(config.extra.get("rope_interleave", True))
    pending: dict[str, WeightTensor] = {}
    for weight in weights:
        layer = _layer_index(weight.name)
        if layer is not None and layer >= config.num_hidden_layers:
            continue
        stem = weight.name.rpartition(".self_attn.")[2]
        if stem in ("k_b_proj.weight", "v_b_proj.weight"):
            pending[weight.name] = weight
            merged = _merge_kv_b(weight.name, pending, mla)
            if merged is not None:
                yield merged
            continue
        if interleaved and stem in ("q_proj.weight", "q_b_proj.weight"):
            yield _reorder_rows(weight, _deinterleave(mla.heads, mla.qk_dim, mla.nope_dim))
        elif interleaved and stem in ("kv_a_proj_with_mqa.weight", "kv_a_proj_with_mqa.bias"):
            yield _reorder_rows(weight, _deinterleave(1, mla.kv_lora_rank + mla.rope_dim, mla.kv_lora_rank))
        else:
            yield weight
    if pending:
        raise ModelLoadError(
            f"The checkpoint has {sorted(pending)[0]} without its pair; the file is damaged."
        )


def _layer_index(name: str) -> int | None:
    if not name.startswith("model.layers."):
        return None
    index = name.split(".", 3)[2]
    return int(index) if index.isdigit() else None


def _deinterleave(groups: int, width: int, start: int) -> np.ndarray:
    """Row order that keeps each group's first `start` rows and turns its (even, odd) pairs after them
    into evens then odds. [groups * width]"""
    inside = np.concatenate(
        (np.arange(start), start + np.arange(0, width - start, 2), start + np.arange(1, width - start, 2))
    )
    return (np.arange(groups)[:, None] * width + inside[None, :]).reshape(-1)


def _reorder_rows(weight: WeightTensor, order: np.ndarray) -> WeightTensor:
    if weight.shape[0] != order.size:
        raise ModelLoadError(
            f"Weight {weight.name!r} has {weight.shape[0]} rows, expected {order.size} from the config."
        )
    return reorder_rows(weight, order)  # an FP8 checkpoint's Q8Linear stays one (hf_q8_blocks.py)


def _merge_kv_b(name: str, pending: dict[str, WeightTensor], mla: MlaSpec) -> WeightTensor | None:
    prefix = name.rpartition(".self_attn.")[0] + ".self_attn."
    k_b, v_b = pending.get(prefix + "k_b_proj.weight"), pending.get(prefix + "v_b_proj.weight")
    if k_b is None or v_b is None:
        return None
    del pending[k_b.name], pending[v_b.name]
    h, r = mla.heads, mla.kv_lora_rank
    try:
        k = k_b.dequantize().reshape(h, r, mla.nope_dim).transpose(0, 2, 1)  # [h, nope, r]
        v = v_b.dequantize().reshape(h, mla.v_dim, r)
    except ValueError as exc:
        raise ModelLoadError(
            f"{k_b.name} / {v_b.name} have shapes {k_b.shape} / {v_b.shape}, which the config contradicts."
        ) from exc
    kv_b = np.ascontiguousarray(np.concatenate((k, v), axis=1).reshape(h * (mla.nope_dim + mla.v_dim), r))
    return WeightTensor(prefix + "kv_b_proj.weight", kv_b.shape, "F32", kv_b)
