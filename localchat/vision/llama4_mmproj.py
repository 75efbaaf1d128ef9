"""Llama 4's vision tower, pixel-shuffle adapter and projector from llama.cpp's `llama4` mmproj GGUF, without
torch: the config.json-shaped dict of a `llama4` text GGUF + its mmproj (what a Llama4ForConditionalGeneration
folder's config gives), and the `v.*` / `mm.*` tensors as float32 arrays under the checkpoint's module names
(the names backends/<lib>/vision/llama4.py load), so the GGUF pair and a folder run the same tower.
The file records no rope theta, tile limit or adapter widths: the theta and the 3 x 3 tile limit are the
values llama.cpp's clip code fixes for `llama4`, the widths are read off the tensors' shapes."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from localchat.vision.qwen_vl_mmproj import _tensor_values

PATCH = "<|patch|>"  # the image placeholder token: config.image_token_index
ROPE_THETA = 10_000.0  # llama.cpp's clip code sets it for `llama4`; transformers' default too
MAX_TILES = 9  # llama.cpp slices a picture into at most 3 x 3 tiles (plus the global one)

_FIXED = {
    "v.patch_embd.weight": "vision_model.patch_embedding.linear.weight",
    "v.position_embd.weight": "vision_model.positional_embedding_vlm",
    "v.class_embd": "vision_model.class_embedding",
    "v.pre_ln.weight": "vision_model.layernorm_pre.weight",
    "v.pre_ln.bias": "vision_model.layernorm_pre.bias",
    "v.post_ln.weight": "vision_model.layernorm_post.weight",
    "v.post_ln.bias": "vision_model.layernorm_post.bias",
    "mm.model.mlp.1.weight": "vision_model.vision_adapter.mlp.fc1.weight",
    "mm.model.mlp.2.weight": "vision_model.vision_adapter.mlp.fc2.weight",
    "mm.model.fc.weight": "multi_modal_projector.linear_1.weight",
}
_LAYER = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_out": "self_attn.o_proj",
    "ln1": "input_layernorm",
    "attn_post_norm": "post_attention_layernorm",
    "ffn_up": "mlp.fc1",
    "ffn_down": "mlp.fc2",
}
_BLOCK = re.compile(r"v\.blk\.(\d+)\.(\w+)\.(weight|bias)")


def llama4_config(meta: dict[str, Any], hidden: int, image_token: int, mmproj: Path) -> dict[str, Any]:
    """A Llama4ForConditionalGeneration-shaped config from the mmproj's metadata (mmproj.py's
    mmproj_metadata, whose `tensors` holds the `mm.*` shapes, input width first) and the text GGUF's width
    and `<|patch|>` id."""
    shapes = meta["tensors"]
    size = int(meta["clip.vision.image_size"])
    scale = int(meta["clip.vision.projector.scale_factor"] or 2)
    preprocessing: dict[str, Any] = {"size": {"height": size, "width": size}, "max_patches": MAX_TILES}
    preprocessing |= {
        key: [float(v) for v in meta[f"clip.vision.{key}"]]
        for key in ("image_mean", "image_std")
        if meta[f"clip.vision.{key}"]
    }
    eps = meta["clip.vision.attention.layer_norm_epsilon"]
    return {
        "model_type": "llama4",
        "image_token_index": image_token,
        "text_config": {"hidden_size": hidden},
        "vision_config": {
            "hidden_size": int(meta["clip.vision.embedding_length"]),
            "intermediate_size": int(meta["clip.vision.feed_forward_length"]),
            "num_hidden_layers": int(meta["clip.vision.block_count"]),
            "num_attention_heads": int(meta["clip.vision.attention.head_count"]),
            "image_size": size,
            "patch_size": int(meta["clip.vision.patch_size"]),
            "pixel_shuffle_ratio": 1.0 / scale,
            "projector_input_dim": int(shapes["mm.model.mlp.1.weight"][1]),
            "projector_output_dim": int(shapes["mm.model.mlp.2.weight"][1]),
            "vision_output_dim": int(shapes["mm.model.fc.weight"][0]),
            "norm_eps": float(eps) if eps is not None else 1e-5,
            "rope_theta": ROPE_THETA,
            "hidden_act": "gelu" if meta["clip.use_gelu"] else "unknown",
        },
        "preprocessing": preprocessing,
        "mmproj": str(mmproj),
    }


def read_llama4_mmproj(mmproj: Path) -> dict[str, np.ndarray]:
    """The tower's and projector's tensors under Llama4ForConditionalGeneration's names, as float32 (a
    quantized mmproj, e.g. Q8_0, dequantized)."""
    from localchat.weights.gguf import open_gguf

    state: dict[str, np.ndarray] = {}
    for tensor in open_gguf(mmproj).tensors:
        name = tensor.name
        match = _BLOCK.fullmatch(name)
        if name in _FIXED:
            state[_FIXED[name]] = _tensor_values(mmproj, tensor)
        elif match and match[2] in _LAYER:
            layer = f"vision_model.model.layers.{match[1]}.{_LAYER[match[2]]}.{match[3]}"
            state[layer] = _tensor_values(mmproj, tensor)
    return state
