"""Llama 4's vision tower, adapter and projector from llama.cpp's `llama4` mmproj GGUF: the tensors renamed
onto the checkpoint's module names (localchat/vision/llama4_mmproj.py), so the tower is the one a
safetensors folder loads (llama4.py) and gives the same embeddings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from localchat.backends.torch.vision.llama4 import Llama4Vision
from localchat.errors import ModelLoadError
from localchat.vision.llama4_mmproj import read_llama4_mmproj


def load_llama4_mmproj(
    config: dict[str, Any], mmproj: Path, dtype: torch.dtype = torch.float32
) -> Llama4Vision:
    """`config`: localchat.vision.mmproj.gguf_vision_config's dict for the pair."""
    model = Llama4Vision(config)
    state = {name: torch.from_numpy(values) for name, values in read_llama4_mmproj(mmproj).items()}
    try:
        model.load_state_dict(state, strict=True)  # a missing tensor is an error, not a random weight
    except RuntimeError as exc:
        raise ModelLoadError(f"{mmproj.name} does not hold a Llama 4 vision tower: {exc}") from exc
    return model.to(dtype).eval()
