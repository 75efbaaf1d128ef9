"""gpt-oss (20B, 120B): registry data and the checkpoint rewrite for OpenAI's open-weight MoE.

Its layers alternate a 128-token sliding window and full attention, each head adds a learned "sink"
logit to the softmax denominator, the router has a bias and takes the softmax of the top-4 logits, and
the experts are clamped SwiGLUs with biases. transformers stores the experts stacked and transposed
([experts, hidden, 2 * inter], gate and up interleaved column by column); `sanitize` turns them into
one [2 * inter, hidden] matrix per expert with the gate rows first, the layout the torch family reads.
The hub's checkpoints ship the expert matrices in MXFP4: repacked here into GGML's MXFP4 blocks
(weights/mxfp4.py), which the torch backend's CPU kernels run in place and other paths dequantize.

llama.cpp's `gpt-oss` GGUF files store the experts stacked [experts, out, in] with gate and up apart
(`ffn_gate_exps`, `ffn_up_exps`, MXFP4 blocks when converted from the hub's checkpoint) and their biases
stacked [experts, out]; the loader fuses gate|up like any split pair. The file records neither the
layer pattern (llama.cpp: even layers slide) nor yarn's `truncate` (gpt-oss's rope does not truncate).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from localchat.errors import ModelLoadError
from localchat.weights.mxfp4 import BLOCK, to_ggml_blocks
from localchat.weights.tensors import WeightTensor

if TYPE_CHECKING:
    from localchat.weights.config import ModelConfig

LAYER_WEIGHTS: dict[str, tuple[str, int, int]] = {
    "self_attn.sinks": ("sinks", 0, 1),
    "self_attn.sinks.weight": ("sinks", 0, 1),  # its name in a GGUF (attn_sinks.weight)
    "mlp.router.weight": ("moe.router", 0, 1),
    "mlp.router.bias": ("moe.router_bias", 0, 1),
    "mlp.experts.{e}.gate_up.weight": ("moe.experts.{e}.gate_up", 0, 1),
    "mlp.experts.{e}.gate_up.bias": ("moe.experts.{e}.gate_up_bias", 0, 1),
    "mlp.experts.{e}.down.weight": ("moe.experts.{e}.down", 0, 1),
    "mlp.experts.{e}.down.bias": ("moe.experts.{e}.down_bias", 0, 1),
    # llama.cpp's files: gate and up apart (fused here in that order), per-expert biases alike.
    "mlp.experts.{e}.gate_proj.weight": ("moe.experts.{e}.gate_up", 0, 2),
    "mlp.experts.{e}.up_proj.weight": ("moe.experts.{e}.gate_up", 1, 2),
    "mlp.experts.{e}.down_proj.weight": ("moe.experts.{e}.down", 0, 1),
    "mlp.experts.{e}.gate_proj.bias": ("moe.experts.{e}.gate_up_bias", 0, 2),
    "mlp.experts.{e}.up_proj.bias": ("moe.experts.{e}.gate_up_bias", 1, 2),
    "mlp.experts.{e}.down_proj.bias": ("moe.experts.{e}.down_bias", 0, 1),
}
GGUF_BLOCK_NAMES: dict[str, str] = {
    "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_sinks": "self_attn.sinks",
    "ffn_gate_inp": "mlp.router",
    "ffn_gate_exps": "mlp.experts.gate_proj",
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
}
GGUF_METADATA: dict[str, str] = {
    "expert_count": "num_local_experts",
    "expert_used_count": "num_experts_per_tok",
}
# The stacked biases of a GGUF ([experts, out]; split_experts splits only 3-D matrices).
_GGUF_STACKED_BIASES = ("gate_proj.bias", "up_proj.bias", "down_proj.bias")
HF_DEFAULTS: dict[str, Any] = {
    "attention_bias": True,
    "sliding_window": 128,
    "rms_norm_eps": 1e-5,
    "rope_theta": 150_000.0,
    "num_experts_per_tok": 4,
}
EXTRA_KEYS: dict[str, Any] = {
    "num_local_experts": 0,
    "num_experts_per_tok": 4,
    "layer_types": None,  # None: even layers slide, odd ones attend fully (sliding_window_pattern 2)
    "sliding_window_pattern": 2,
    "swiglu_limit": 7.0,
    "swiglu_alpha": 1.702,
}
# The stacked expert tensors by their leaf name: (our per-expert name, whether it is a matrix).
_STACKED = {
    "gate_up_proj": ("gate_up.weight", True),
    "gate_up_proj_bias": ("gate_up.bias", False),
    "down_proj": ("down.weight", True),
    "down_proj_bias": ("down.bias", False),
}


def sanitize(config: ModelConfig, weights: Iterable[WeightTensor]) -> Iterator[WeightTensor]:
    """Stacked experts -> one weight per expert ([out, in], gate rows then up rows); MXFP4 experts (the
    hub's `*_blocks` + `*_scales`, each pair in either order) repacked into GGML MXFP4 blocks on the way;
    a GGUF's stacked expert biases split per expert; others unchanged."""
    del config
    parts: dict[str, dict[str, WeightTensor]] = {}  # MXFP4 tensor stem -> the halves seen so far
    for weight in weights:
        stem, _, leaf = weight.name.rpartition(".experts.")
        if stem and leaf.endswith(("_blocks", "_scales")):
            base, _, kind = weight.name.rpartition("_")
            pair = parts.setdefault(base, {})
            pair[kind] = weight
            if len(pair) == 2:
                del parts[base]
                yield from _mxfp4_experts(base, pair["blocks"], pair["scales"])
            continue
        if stem and leaf in _GGUF_STACKED_BIASES and len(weight.shape) == 2:
            data = np.asarray(weight.data).reshape(weight.shape)
            for e in range(weight.shape[0]):
                yield WeightTensor(f"{stem}.experts.{e}.{leaf}", (weight.shape[1],), weight.dtype, data[e])
            continue
        if not stem or leaf not in _STACKED:
            yield weight
            continue
        name, matrix = _STACKED[leaf]
        data = np.asarray(weight.data).reshape(weight.shape)
        for e in range(weight.shape[0]):
            part = data[e].T if matrix else data[e]  # [in, out] -> [out, in]
            yield _expert(f"{stem}.experts.{e}.{name}", part, weight.dtype, leaf.startswith("gate_up"))
    if parts:
        raise ModelLoadError(f"MXFP4 tensors without their blocks or scales: {sorted(parts)}")


def derive_sizes(config: ModelConfig) -> None:
    """gpt-oss's yarn interpolates without rounding its band to whole dims (transformers: truncate
    false, in every published config); a GGUF does not record it, so it is set where absent."""
    scaling = config.rope_scaling
    if scaling and scaling.get("rope_type", scaling.get("type")) == "yarn":
        scaling.setdefault("truncate", False)


def _mxfp4_experts(base: str, blocks: WeightTensor, scales: WeightTensor) -> Iterator[WeightTensor]:
    """`...experts.gate_up_proj` blocks [E, out, G, 16] + scales [E, out, G] -> per expert one MXFP4
    matrix [out, G * 32] of GGML blocks (uint8 [out, G * 17]); the hub stores these already [out, in]
    (transformers transposes after dequantizing)."""
    stem, _, leaf = base.rpartition(".experts.")
    if leaf not in _STACKED or not _STACKED[leaf][1]:
        raise ModelLoadError(f"Unexpected MXFP4 tensor {base}")
    name = _STACKED[leaf][0]
    codes, exps = np.asarray(blocks.data), np.asarray(scales.data)
    for e in range(codes.shape[0]):  # one expert at a time: a copy of all of them would double the memory
        part = to_ggml_blocks(codes[e], exps[e])
        weight = _expert(f"{stem}.experts.{e}.{name}", part, "MXFP4", leaf.startswith("gate_up"))
        yield WeightTensor(weight.name, (part.shape[0], codes.shape[2] * BLOCK), "MXFP4", weight.data)


def _expert(name: str, part: np.ndarray, dtype: str, interleaved: bool) -> WeightTensor:
    if interleaved:  # gate and up alternate along the output axis: gather each half together
        part = np.concatenate([part[0::2], part[1::2]])
    part = np.ascontiguousarray(part)
    return WeightTensor(name, part.shape, dtype, part)
