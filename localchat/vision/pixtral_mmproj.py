"""Mistral Small 3.x's Pixtral tower + Mistral 3 projector from llama.cpp's `pixtral` mmproj GGUF, without
torch: the config.json-shaped dict of a text GGUF + its mmproj (what a Mistral3ForConditionalGeneration
folder's config gives), and the `v.*` / `mm.*` tensors as float32 arrays under the checkpoint's module
names (the names backends/<lib>/vision/pixtral.py load), so the GGUF pair and a folder run the same
tower. llama.cpp's converter interleaves the q/k rows of each head for its rope kernel: undone here.
The mmproj records no rope theta (llama.cpp fixes Pixtral's at 10000) and no projector activation (GELU)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from localchat.vision.llava_mmproj import _values

# Text GGUF architectures a `pixtral` projector feeds: llama.cpp writes Mistral3ForConditionalGeneration's
# text model as `mistral3` now, and wrote it as `llama` before (the early Mistral Small 3.1 GGUFs).
PIXTRAL_TEXT_ARCHS = ("mistral3", "llama")
IMAGE = "[IMG]"

_FIXED = {
    "v.patch_embd.weight": "vision_tower.patch_conv.weight",
    "v.pre_ln.weight": "vision_tower.ln_pre.weight",
    "mm.input_norm.weight": "multi_modal_projector.norm.weight",
    "mm.patch_merger.weight": "multi_modal_projector.patch_merger.merging_layer.weight",
    "mm.1.weight": "multi_modal_projector.linear_1.weight",
    "mm.1.bias": "multi_modal_projector.linear_1.bias",
    "mm.2.weight": "multi_modal_projector.linear_2.weight",
    "mm.2.bias": "multi_modal_projector.linear_2.bias",
}
_LAYER = {
    "attn_q": "attention.q_proj",
    "attn_k": "attention.k_proj",
    "attn_v": "attention.v_proj",
    "attn_out": "attention.o_proj",
    "ln1": "attention_norm",
    "ln2": "ffn_norm",
    "ffn_gate": "feed_forward.gate_proj",
    "ffn_up": "feed_forward.up_proj",
    "ffn_down": "feed_forward.down_proj",
}
_BLOCK = re.compile(r"v\.blk\.(\d+)\.(\w+)\.weight")


def pixtral_config(
    meta: dict[str, Any], hidden: int, text_eps: float, image_token: int, mmproj: Path
) -> dict[str, Any]:
    """A Mistral3ForConditionalGeneration-shaped config from the mmproj's metadata (mmproj.py's
    mmproj_metadata) and the text GGUF's width, RMSNorm epsilon and `[IMG]` id."""
    size = int(meta["clip.vision.image_size"])
    preprocessing: dict[str, Any] = {"size": {"longest_edge": size}}
    preprocessing |= {
        key: [float(v) for v in meta[f"clip.vision.{key}"]]
        for key in ("image_mean", "image_std")
        if meta[f"clip.vision.{key}"]
    }
    return {
        "model_type": "mistral3",
        "image_token_index": image_token,
        "spatial_merge_size": int(meta["clip.vision.spatial_merge_size"] or 1),
        "vision_feature_layer": -1,
        "projector_hidden_act": "gelu",
        "multimodal_projector_bias": "mm.1.bias" in meta["tensors"],
        "text_config": {"hidden_size": hidden, "rms_norm_eps": text_eps},
        "vision_config": {
            "hidden_size": int(meta["clip.vision.embedding_length"]),
            "intermediate_size": int(meta["clip.vision.feed_forward_length"]),
            "num_hidden_layers": int(meta["clip.vision.block_count"]),
            "num_attention_heads": int(meta["clip.vision.attention.head_count"]),
            "image_size": size,
            "patch_size": int(meta["clip.vision.patch_size"]),
            "hidden_act": "silu" if meta.get("clip.use_silu") else "gelu",
            "rope_theta": 10_000.0,
        },
        "preprocessing": preprocessing,
        "mmproj": str(mmproj),
    }


def _unpermute(values: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp stores each head's rows i and i + head_dim/2 as rows 2i, 2i+1: back to rotate-half."""
    rows, rest = values.shape[0], values.shape[1:]
    half = rows // heads // 2
    return np.ascontiguousarray(values.reshape(heads, half, 2, *rest).swapaxes(1, 2)).reshape(rows, *rest)


def read_pixtral_mmproj(config: dict[str, Any], mmproj: Path) -> dict[str, np.ndarray]:
    """`config`: pixtral_config's dict for the pair."""
    from localchat.weights.gguf import open_gguf

    heads = int(config["vision_config"]["num_attention_heads"])
    state: dict[str, np.ndarray] = {}
    for tensor in open_gguf(mmproj).tensors:
        name = tensor.name
        match = _BLOCK.fullmatch(name)
        if name in _FIXED:
            state[_FIXED[name]] = _values(mmproj, tensor)
        elif match and match[2] in _LAYER:
            values = _values(mmproj, tensor)
            if match[2] in ("attn_q", "attn_k"):
                values = _unpermute(values, heads)
            state[f"vision_tower.transformer.layers.{match[1]}.{_LAYER[match[2]]}.weight"] = values
    return state
