"""SmolVLM / Idefics3 from llama.cpp's `idefics3` mmproj (written by convert_hf_to_gguf.py --mmproj), without
torch: the config.json-shaped dict of a llama GGUF + that projector (the tower's sizes, the pixel-shuffle
scale, the tiling sizes: `clip.vision.preproc_image_size` is the processor's longest edge, the tower's
image size its tile), and the projector's `v.*` / `mm.model.fc` tensors under the checkpoint's names."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from localchat.vision.llava_mmproj import _values  # f32 / f16 / bf16 tensors; other types a typed error
from localchat.weights.gguf import open_gguf

_FIXED = {
    "v.patch_embd.weight": "model.vision_model.embeddings.patch_embedding.weight",
    "v.patch_embd.bias": "model.vision_model.embeddings.patch_embedding.bias",
    "v.position_embd.weight": "model.vision_model.embeddings.position_embedding.weight",
    "v.post_ln.weight": "model.vision_model.post_layernorm.weight",
    "v.post_ln.bias": "model.vision_model.post_layernorm.bias",
    "mm.model.fc.weight": "model.connector.modality_projection.proj.weight",
}
_LAYER = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_out": "self_attn.out_proj",
    "ln1": "layer_norm1",
    "ln2": "layer_norm2",
    "ffn_up": "mlp.fc1",
    "ffn_down": "mlp.fc2",
}
_BLOCK = re.compile(r"v\.blk\.(\d+)\.(\w+)\.(weight|bias)")


def smolvlm_config(meta: dict[str, Any], hidden: int, image_token: int, mmproj: Path) -> dict[str, Any]:
    """`meta`: localchat.vision.mmproj's reading of the projector's `clip.*` keys."""
    size = int(meta["clip.vision.image_size"])
    eps = meta["clip.vision.attention.layer_norm_epsilon"]
    preprocessing: dict[str, Any] = {"max_image_size": {"longest_edge": size}}
    if meta.get("clip.vision.preproc_image_size"):
        preprocessing["size"] = {"longest_edge": int(meta["clip.vision.preproc_image_size"])}
    for key in ("image_mean", "image_std"):
        if meta[f"clip.vision.{key}"]:
            preprocessing[key] = [float(v) for v in meta[f"clip.vision.{key}"]]
    return {
        "model_type": "smolvlm",
        "image_token_id": image_token,
        "scale_factor": int(meta["clip.vision.projector.scale_factor"] or 2),
        "text_config": {"hidden_size": hidden},
        "vision_config": {
            "hidden_size": int(meta["clip.vision.embedding_length"]),
            "intermediate_size": int(meta["clip.vision.feed_forward_length"]),
            "num_hidden_layers": int(meta["clip.vision.block_count"]),
            "num_attention_heads": int(meta["clip.vision.attention.head_count"]),
            "image_size": size,
            "patch_size": int(meta["clip.vision.patch_size"]),
            "layer_norm_eps": float(eps) if eps is not None else 1e-6,
        },
        "preprocessing": preprocessing,
        "mmproj": str(mmproj),
    }


def _our_name(name: str) -> str | None:
    if name in _FIXED:
        return _FIXED[name]
    match = _BLOCK.fullmatch(name)
    if match and match[2] in _LAYER:
        return f"model.vision_model.encoder.layers.{match[1]}.{_LAYER[match[2]]}.{match[3]}"
    return None


def read_smolvlm_mmproj(mmproj: Path) -> dict[str, np.ndarray]:
    """The projector's tensors as float32 arrays under the safetensors checkpoint's names."""
    state: dict[str, np.ndarray] = {}
    for tensor in open_gguf(mmproj).tensors:
        if (ours := _our_name(tensor.name)) is not None:
            state[ours] = _values(mmproj, tensor)
    return state
