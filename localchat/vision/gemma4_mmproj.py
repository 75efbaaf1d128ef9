"""Gemma 4's vision tower + embedder from llama.cpp's `gemma4v` mmproj GGUF, without torch: the
config.json-shaped dict of a text GGUF + its mmproj (what a Gemma4ForConditionalGeneration folder's config
gives), and the `v.*` / `mm.*` tensors as float32 arrays under the checkpoint's module names (the names
backends/torch/vision/gemma4.py loads), so the GGUF pair and a folder run the same tower.

The mmproj records no head size, KV heads, position table size, pooling kernel, clipping or standardizing:
they are read off the tensors (q_norm's width, the position table's shape, the presence of the clamp
scalars and of std_bias), and the kernel is 3 as in every Gemma 4 checkpoint. llama.cpp stores the patch
projection as a conv kernel [hidden, 3, p, p]: turned back into the checkpoint's [hidden, p * p * 3]."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from localchat.errors import ModelLoadError
from localchat.vision.llava_mmproj import _values

IMAGE = "<|image|>"  # the placeholder token a `gemma4v` projector's text model must have
_FIXED = {
    "v.patch_embd.weight": "vision_tower.patch_embedder.input_proj.weight",
    "v.position_embd.weight": "vision_tower.patch_embedder.position_embedding_table",
    "v.std_bias": "vision_tower.std_bias",
    "v.std_scale": "vision_tower.std_scale",
    "mm.input_projection.weight": "embed_vision.embedding_projection.weight",
}
_LINEAR = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_out": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_NORM = {
    "ln1": "input_layernorm",
    "attn_post_norm": "post_attention_layernorm",
    "ln2": "pre_feedforward_layernorm",
    "ffn_post_norm": "post_feedforward_layernorm",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
}
_BLOCK = re.compile(r"v\.blk\.(\d+)\.(\w+)\.(weight|input_min|input_max|output_min|output_max)")


def _our_name(name: str) -> str | None:
    if name in _FIXED:
        return _FIXED[name]
    match = _BLOCK.fullmatch(name)
    if match is None:
        return None
    at, part, suffix = f"vision_tower.encoder.layers.{match[1]}.", match[2], match[3]
    if part in _LINEAR:
        return at + _LINEAR[part] + (".linear.weight" if suffix == "weight" else f".{suffix}")
    if part in _NORM and suffix == "weight":
        return at + _NORM[part] + ".weight"
    return None


def gemma4_tensors(mmproj: Path, tensors: Iterable[Any]) -> dict[str, np.ndarray]:
    """`tensors`: the mmproj's (a GGUF reader's `tensors`). The tower and embedder's tensors as float32
    arrays under the checkpoint's names; ModelLoadError for a tensor this tower has no place for (a newer
    projector layout), rather than dropping it."""
    out: dict[str, np.ndarray] = {}
    for tensor in tensors:
        if not tensor.name.startswith(("v.", "mm.")):
            continue  # the audio tower (`a.*`) of a vision + audio projector is not run
        ours = _our_name(tensor.name)
        if ours is None:
            raise ModelLoadError(
                f"{mmproj.name} holds {tensor.name}, which localchat's Gemma 4 vision tower does not know; "
                "this projector is not supported yet. Load the model without --mmproj to chat without images."
            )
        values = _values(mmproj, tensor)
        if tensor.name == "v.patch_embd.weight":  # [hidden, 3, p, p] -> [hidden, p * p * 3]
            values = values.transpose(0, 2, 3, 1).reshape(values.shape[0], -1)
        elif ours.endswith(("_min", "_max")):  # clamp bounds: scalars in the checkpoint
            values = values.reshape(())
        out[ours] = np.ascontiguousarray(values)
    return out


def gemma4_config(
    meta: dict[str, Any], mmproj: Path, tensors: Iterable[Any], hidden: int, image_token: int
) -> dict[str, Any]:
    """A Gemma4ForConditionalGeneration-shaped config from the mmproj's metadata (mmproj.py's
    mmproj_metadata), its tensors' shapes (a GGUF reader's `tensors`: the header alone is read) and the
    text GGUF's width and `<|image|>` id."""
    shapes = {
        ours: tuple(int(d) for d in reversed(t.shape))
        for t in tensors
        if (ours := _our_name(t.name)) is not None
    }
    at = "vision_tower.encoder.layers.0.self_attn."
    head_dim = shapes[at + "q_norm.weight"][0]
    kv_heads = shapes[at + "k_proj.linear.weight"][0] // head_dim
    eps = meta["clip.vision.attention.layer_norm_epsilon"]
    return {
        "model_type": "gemma4",
        "image_token_id": image_token,
        "text_config": {"hidden_size": hidden},
        "vision_config": {
            "hidden_size": int(meta["clip.vision.embedding_length"]),
            "intermediate_size": int(meta["clip.vision.feed_forward_length"]),
            "num_hidden_layers": int(meta["clip.vision.block_count"]),
            "num_attention_heads": int(meta["clip.vision.attention.head_count"]),
            "num_key_value_heads": kv_heads,
            "head_dim": head_dim,
            "patch_size": int(meta["clip.vision.patch_size"]),
            "pooling_kernel_size": 3,
            "position_embedding_size": shapes["vision_tower.patch_embedder.position_embedding_table"][1],
            "rms_norm_eps": float(eps) if eps is not None else 1e-6,
            "use_clipped_linears": any(name.endswith("input_min") for name in shapes),
            "standardize": "vision_tower.std_bias" in shapes,
        },
        "mmproj": str(mmproj),
    }
