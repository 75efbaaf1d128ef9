"""Gemma 3's vision tower + projector from llama.cpp's mmproj GGUF: its `v.*` / `mm.*` tensors renamed onto
the checkpoint's module names, so the tower is the one a safetensors folder loads (gemma3.py) and gives
the same embeddings. The converter stores the projector norm as 1 + weight (llama.cpp's RMSNorm
multiplies by the weight alone): the 1 is taken back off here."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from localchat.backends.torch.vision.gemma3 import Gemma3Vision
from localchat.errors import ModelLoadError
from localchat.weights.gguf import open_gguf

_FIXED = {
    "v.patch_embd.weight": "vision_tower.embeddings.patch_embedding.weight",
    "v.patch_embd.bias": "vision_tower.embeddings.patch_embedding.bias",
    "v.position_embd.weight": "vision_tower.embeddings.position_embedding.weight",
    "v.post_ln.weight": "vision_tower.post_layernorm.weight",
    "v.post_ln.bias": "vision_tower.post_layernorm.bias",
    "mm.input_projection.weight": "multi_modal_projector.mm_input_projection_weight",
    "mm.soft_emb_norm.weight": "multi_modal_projector.mm_soft_emb_norm.weight",
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


def _our_name(name: str) -> str | None:
    if name in _FIXED:
        return _FIXED[name]
    match = _BLOCK.fullmatch(name)
    if match and match[2] in _LAYER:
        return f"vision_tower.encoder.layers.{match[1]}.{_LAYER[match[2]]}.{match[3]}"
    return None


def load_gemma3_mmproj(
    config: dict[str, Any], mmproj: Path, dtype: torch.dtype = torch.float32
) -> Gemma3Vision:
    """`config`: localchat.vision.mmproj.gguf_vision_config's dict for the pair."""
    model = Gemma3Vision(config)
    state: dict[str, torch.Tensor] = {}
    for tensor in open_gguf(mmproj).tensors:
        ours = _our_name(tensor.name)
        if ours is None:
            continue
        if tensor.tensor_type.name not in ("F32", "F16", "BF16"):
            raise ModelLoadError(
                f"{mmproj.name} stores {tensor.name} as {tensor.tensor_type.name}; localchat reads f32, "
                "f16 and bf16 projector files. Download the mmproj's f16 file."
            )
        data = np.asarray(tensor.data)
        if tensor.tensor_type.name == "BF16":  # stored as raw 16-bit words
            values = torch.from_numpy(data.view(np.int16).copy()).view(torch.bfloat16).float()
        else:
            values = torch.from_numpy(data.astype(np.float32))
        state[ours] = values.reshape([int(d) for d in reversed(tensor.shape)])
    if "multi_modal_projector.mm_soft_emb_norm.weight" in state:
        state["multi_modal_projector.mm_soft_emb_norm.weight"] -= 1.0
    try:
        model.load_state_dict(state, strict=True)  # a missing tensor is an error, not a random weight
    except RuntimeError as exc:
        raise ModelLoadError(f"{mmproj.name} does not hold a Gemma 3 vision tower: {exc}") from exc
    return model.to(dtype).eval()
