"""LLaVA's CLIP tower + MLP projector from llama.cpp's `mlp` mmproj GGUF: its `v.*` / `mm.0.*` / `mm.2.*`
tensors renamed onto llava.py's module names, so the tower is the one a safetensors folder loads and gives
the same embeddings. llama.cpp's legacy converter names a layer's first MLP matrix `ffn_down` and the
second `ffn_up` (newer converters the other way round): which is which is read from the shapes."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from localchat.backends.torch.vision.llava import LlavaVision
from localchat.errors import ModelLoadError
from localchat.weights.gguf import open_gguf

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
}
_LAYER = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_out": "self_attn.out_proj",
    "ln1": "layer_norm1",
    "ln2": "layer_norm2",
    "ffn_up": "mlp.fc?",
    "ffn_down": "mlp.fc?",
}
_BLOCK = re.compile(r"v\.blk\.(\d+)\.(\w+)\.(weight|bias)")


def _values(mmproj: Path, tensor: Any) -> torch.Tensor:
    kind = tensor.tensor_type.name
    if kind not in ("F32", "F16", "BF16"):
        raise ModelLoadError(
            f"{mmproj.name} stores {tensor.name} as {kind}; localchat reads f32, f16 and bf16 projector "
            "files. Download the mmproj's f16 file."
        )
    data = np.asarray(tensor.data)
    if kind == "BF16":  # stored as raw 16-bit words
        values = torch.from_numpy(data.view(np.int16).copy()).view(torch.bfloat16).float()
    else:
        values = torch.from_numpy(data.astype(np.float32))
    return values.reshape([int(d) for d in reversed(tensor.shape)])


def _our_name(name: str, values: torch.Tensor, hidden: int) -> str | None:
    if name in _FIXED:
        return _FIXED[name]
    match = _BLOCK.fullmatch(name)
    if not match or match[2] not in _LAYER:
        return None
    ours = _LAYER[match[2]]
    if ours == "mlp.fc?":  # fc1 maps the width up: weight [inner, hidden], bias [inner]
        ours = "mlp.fc1" if values.shape[0] != hidden else "mlp.fc2"
    return f"vision_tower.encoder.layers.{match[1]}.{ours}.{match[3]}"


def load_llava_mmproj(
    config: dict[str, Any], mmproj: Path, dtype: torch.dtype = torch.float32
) -> LlavaVision:
    """`config`: localchat.vision.mmproj.gguf_vision_config's dict for the pair."""
    model = LlavaVision(config)
    hidden = int(config["vision_config"]["hidden_size"])
    state: dict[str, torch.Tensor] = {}
    for tensor in open_gguf(mmproj).tensors:
        if not tensor.name.startswith(("v.", "mm.")):
            continue
        values = _values(mmproj, tensor)
        ours = _our_name(tensor.name, values, hidden)
        if ours is not None:
            state[ours] = values
    try:
        model.load_state_dict(state, strict=True)  # a missing tensor is an error, not a random weight
    except RuntimeError as exc:
        raise ModelLoadError(f"{mmproj.name} does not hold a LLaVA CLIP tower: {exc}") from exc
    return model.to(dtype).eval()
