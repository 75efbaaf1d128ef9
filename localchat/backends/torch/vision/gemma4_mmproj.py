"""Gemma 4's vision tower + embedder from llama.cpp's `gemma4v` mmproj GGUF: the tensors renamed onto the
checkpoint's module names (localchat/vision/gemma4_mmproj.py), so the tower is the one a safetensors folder
loads (gemma4.py) and gives the same embeddings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from localchat.backends.torch.vision.gemma4 import Gemma4Vision
from localchat.errors import ModelLoadError
from localchat.vision.gemma4_mmproj import gemma4_tensors
from localchat.weights.gguf import open_gguf


def load_gemma4_mmproj(
    config: dict[str, Any], mmproj: Path, dtype: torch.dtype = torch.float32
) -> Gemma4Vision:
    """`config`: localchat.vision.mmproj.gguf_vision_config's dict for the pair."""
    model = Gemma4Vision(config)
    state = {
        name: torch.from_numpy(values)
        for name, values in gemma4_tensors(mmproj, open_gguf(mmproj).tensors).items()
    }
    try:
        model.load_state_dict(state, strict=True)  # a missing tensor is an error, not a random weight
    except RuntimeError as exc:
        raise ModelLoadError(f"{mmproj.name} does not hold a Gemma 4 vision tower: {exc}") from exc
    return model.to(dtype).eval()
