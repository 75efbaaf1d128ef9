"""Llama 4 (Scout, Maverick) text model facts both backends share: checkpoint names, config defaults, and
`sanitize`, which brings the checkpoint to the layout the model files read.

- RoPE turns (x0, x1) pairs (complex form) and NoPE layers (`no_rope_layers[i] == 0`, every 4th) have
  none: q/k rows are reordered per head to evens | odds at load, after which the usual rotate-half RoPE is
  exact (the L2 q/k norm and q.k do not depend on the order of a head's dims);
- the stacked experts are stored [experts, in, out]: transposed to [experts, out, in] at load;
- rope layers attend within chunks of `attention_chunk_size` tokens; localchat has no chunked mask, so
  `derive_sizes` caps the served context at one chunk, where chunked and causal attention agree.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from localchat.errors import ModelLoadError
from localchat.weights.hf_quant_blocks import reorder_rows
from localchat.weights.tensors import WeightTensor

if TYPE_CHECKING:
    from localchat.weights.config import ModelConfig

LAYER_WEIGHTS: dict[str, tuple[str, int, int]] = {
    "input_layernorm.weight": ("attn_norm", 0, 1),
    "self_attn.q_proj.weight": ("qkv", 0, 3),
    "self_attn.k_proj.weight": ("qkv", 1, 3),
    "self_attn.v_proj.weight": ("qkv", 2, 3),
    "self_attn.o_proj.weight": ("o", 0, 1),
    "post_attention_layernorm.weight": ("mlp_norm", 0, 1),
    "feed_forward.gate_proj.weight": ("gate_up", 0, 2),
    "feed_forward.up_proj.weight": ("gate_up", 1, 2),
    "feed_forward.down_proj.weight": ("down", 0, 1),
    "feed_forward.router.weight": ("moe.router", 0, 1),
    "feed_forward.experts.{e}.gate_up_proj": ("moe.experts.{e}.gate_up", 0, 1),
    "feed_forward.experts.{e}.down_proj": ("moe.experts.{e}.down", 0, 1),
    # llama.cpp's files: gate and up stacked apart, already [experts, out, in].
    "feed_forward.experts.{e}.gate_proj.weight": ("moe.experts.{e}.gate_up", 0, 2),
    "feed_forward.experts.{e}.up_proj.weight": ("moe.experts.{e}.gate_up", 1, 2),
    "feed_forward.experts.{e}.down_proj.weight": ("moe.experts.{e}.down", 0, 1),
    "feed_forward.shared_expert.gate_proj.weight": ("moe.shared.gate_up", 0, 2),
    "feed_forward.shared_expert.up_proj.weight": ("moe.shared.gate_up", 1, 2),
    "feed_forward.shared_expert.down_proj.weight": ("moe.shared.down", 0, 1),
}
# transformers' Llama4TextConfig defaults for keys a config.json may leave out.
HF_DEFAULTS: dict[str, Any] = {"rope_theta": 500_000.0, "rms_norm_eps": 1e-5, "head_dim": 128}
EXTRA_KEYS: dict[str, Any] = {
    "no_rope_layers": None,
    "no_rope_layer_interval": 4,
    "use_qk_norm": True,
    "attn_temperature_tuning": True,
    "floor_scale": 8192,
    "attn_scale": 0.1,
    "attention_chunk_size": 8192,
    "num_local_experts": 16,
    "num_experts_per_tok": 1,
    "moe_layers": None,
    "interleave_moe_layer_step": 1,
    "intermediate_size_mlp": 16384,
}
# Llama4ForConditionalGeneration's checkpoint: the text LM under language_model; the vision model and the
# projector are not run.
TEXT_PREFIXES: dict[str, str | None] = {
    "language_model.model.": "model.",
    "language_model.lm_head.": "lm_head.",
    "vision_model.": None,
    "multi_modal_projector.": None,
}


# llama.cpp's llama4 blocks (converted without the Llama q/k permutation: rows as in the checkpoint).
GGUF_BLOCK_NAMES: dict[str, str] = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "feed_forward.gate_proj",
    "ffn_up": "feed_forward.up_proj",
    "ffn_down": "feed_forward.down_proj",
    "ffn_gate_inp": "feed_forward.router",
    "ffn_gate_exps": "feed_forward.experts.gate_proj",
    "ffn_up_exps": "feed_forward.experts.up_proj",
    "ffn_down_exps": "feed_forward.experts.down_proj",
    "ffn_gate_shexp": "feed_forward.shared_expert.gate_proj",
    "ffn_up_shexp": "feed_forward.shared_expert.up_proj",
    "ffn_down_shexp": "feed_forward.shared_expert.down_proj",
}
# The converter swaps the widths: feed_forward_length is the dense layers', expert_feed_forward_length
# the experts' (transformers' intermediate_size).
GGUF_METADATA: dict[str, str] = {
    "expert_count": "num_local_experts",
    "expert_used_count": "num_experts_per_tok",
    "interleave_moe_layer_step": "interleave_moe_layer_step",
    "feed_forward_length": "intermediate_size_mlp",
    "expert_feed_forward_length": "gguf_expert_width",
}


def uses_rope(config: ModelConfig, index: int) -> bool:
    """`no_rope_layers[i]` is 1 where layer i turns q and k; by default every 4th layer does not (also
    SmolLM3's rule; llama.cpp's files of both record no list and use that default)."""
    flags = config.extra.get("no_rope_layers")
    if flags:
        return bool(flags[index])
    return (index + 1) % int(config.extra.get("no_rope_layer_interval") or 4) != 0


def moe_layers(config: ModelConfig) -> frozenset[int]:
    x = config.extra
    if x.get("moe_layers") is not None:
        return frozenset(int(i) for i in x["moe_layers"])
    step = max(1, int(x.get("interleave_moe_layer_step") or 1))
    return frozenset(range(step - 1, config.num_hidden_layers, step))


def derive_sizes(config: ModelConfig) -> None:
    """Serve at most one attention chunk (see the module note); a GGUF's expert width as transformers
    names it, and its q/k norm as llama.cpp decides it (all but the 128-expert Maverick). Idempotent."""
    x = config.extra
    if x.get("gguf_expert_width"):
        config.intermediate_size = int(x["gguf_expert_width"])
        x["use_qk_norm"] = int(x.get("num_local_experts") or 0) != 128
        x["gguf_expert_width"] = None  # once: ModelConfig runs this after every construction
    chunk = config.extra.get("attention_chunk_size")
    if chunk:
        config.max_position_embeddings = min(config.max_position_embeddings, int(chunk))


def sanitize(config: ModelConfig, weights: Iterable[WeightTensor]) -> Iterator[WeightTensor]:
    """q/k rows de-interleaved per head; stacked experts [E, in, out] -> [E, out, in]."""
    d = config.head_dim
    for weight in weights:
        stem = weight.name.rpartition(".self_attn.")[2]
        if stem in ("q_proj.weight", "k_proj.weight", "q_proj.bias", "k_proj.bias"):
            heads = weight.shape[0] // d
            order = (
                np.arange(heads)[:, None] * d + np.concatenate((np.arange(0, d, 2), np.arange(1, d, 2)))
            ).ravel()
            yield reorder_rows(weight, order)  # an FP8 / int4 checkpoint's compact linear stays one
        elif weight.name.endswith(("feed_forward.experts.gate_up_proj", "feed_forward.experts.down_proj")):
            if len(weight.shape) != 3 or weight.dtype not in ("F32", "F16", "BF16"):
                raise ModelLoadError(
                    f"Weight {weight.name!r} is not a dense 3-D expert stack; the checkpoint is damaged."
                )
            stack = np.ascontiguousarray(np.swapaxes(np.asarray(weight.data), 1, 2))
            experts, inputs, outputs = weight.shape
            yield WeightTensor(weight.name, (experts, outputs, inputs), weight.dtype, stack)
        else:
            yield weight
