"""LLaVA's CLIP tower + MLP projector from llama.cpp's `mlp` mmproj GGUF, without torch: its `v.*` /
`mm.0.*` / `mm.2.*` tensors as float32 arrays under the checkpoint's module names (the names
backends/<lib>/vision/llava.py load), so the GGUF pair and a safetensors folder run the same tower.
llama.cpp's legacy converter names a layer's first MLP matrix `ffn_down` and the second `ffn_up` (newer
converters the other way round): which is which is read from the shapes."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from localchat.errors import ModelLoadError

_FIXED = {
    "v.class_embd": "vision_tower.embeddings.class_embedding",
    "v.patch_embd.weight": "vision_tower.embeddings.patch_embedding.weight",
    "v.position_embd.weight": "vision_tower.embeddings.position_embedding.weight",
    "v.pre_ln.weight": "vision_tower.pre_layrnorm.weight",
    "v.pre_ln.bias": "vision_tower.pre_layrnorm.bias",
    "mm.0.weight": "multi_modal_projector.linear_1.weight",
    "mm.0.bias": "multi_modal_projector.linear_1.bias",
    "mm.2.weight": "multi_modal_projector.linear_2.weight",
    "mm.2.bias": "multi_modal_projector.linear_2.bias",
    "model.image_newline": "image_newline",  # LLaVA-NeXT's
}
_LAYER = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_out": "self_attn.out_proj",
    "ln1": "layer_norm1",
    "ln2": "layer_norm2",
    "ffn_up": "mlp",
    "ffn_down": "mlp",
}
_BLOCK = re.compile(r"v\.blk\.(\d+)\.(\w+)\.(weight|bias)")


def _values(mmproj: Path, tensor: Any) -> np.ndarray:
    kind = tensor.tensor_type.name
    if kind not in ("F32", "F16", "BF16"):
        raise ModelLoadError(
            f"{mmproj.name} stores {tensor.name} as {kind}; localchat reads f32, f16 and bf16 projector "
            "files. Download the mmproj's f16 file."
        )
    data = np.asarray(tensor.data)
    if kind == "BF16":  # raw 16-bit words: the high half of a float32
        values = (data.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    else:
        values = data.astype(np.float32)
    return values.reshape([int(d) for d in reversed(tensor.shape)])  # GGUF lists dimensions innermost first


def _our_name(name: str, values: np.ndarray, hidden: int) -> str | None:
    if name in _FIXED:
        return _FIXED[name]
    match = _BLOCK.fullmatch(name)
    if not match or match[2] not in _LAYER:
        return None
    ours = _LAYER[match[2]]
    if ours == "mlp":  # fc1 maps the width up: weight [inner, hidden], bias [inner]
        ours = "mlp.fc1" if values.shape[0] != hidden else "mlp.fc2"
    return f"vision_tower.encoder.layers.{match[1]}.{ours}.{match[3]}"


def read_llava_mmproj(config: dict[str, Any], mmproj: Path) -> dict[str, np.ndarray]:
    """`config`: localchat.vision.mmproj.gguf_vision_config's dict for the pair."""
    from localchat.weights.gguf import open_gguf

    hidden = int(config["vision_config"]["hidden_size"])
    state: dict[str, np.ndarray] = {}
    for tensor in open_gguf(mmproj).tensors:
        if tensor.name.startswith(("v.", "mm.", "model.image_newline")):
            values = _values(mmproj, tensor)
            if (ours := _our_name(tensor.name, values, hidden)) is not None:
                state[ours] = values
    return state
