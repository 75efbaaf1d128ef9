"""LLaVA's CLIP tower + MLP projector from llama.cpp's `mlp` mmproj GGUF on torch: the tensors under the
checkpoint's names (localchat/vision/llava_mmproj.py) loaded into llava.py's modules, so the tower is the
one a safetensors folder loads and gives the same embeddings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from localchat.backends.torch.vision.llava import LlavaVision
from localchat.errors import ModelLoadError
from localchat.vision.llava_mmproj import read_llava_mmproj


def load_llava_mmproj(
    config: dict[str, Any], mmproj: Path, dtype: torch.dtype = torch.float32
) -> LlavaVision:
    """`config`: localchat.vision.mmproj.gguf_vision_config's dict for the pair."""
    model = LlavaVision(config)
    state = {name: torch.from_numpy(values) for name, values in read_llava_mmproj(config, mmproj).items()}
    try:
        model.load_state_dict(state, strict=True)  # a missing tensor is an error, not a random weight
    except RuntimeError as exc:
        raise ModelLoadError(f"{mmproj.name} does not hold a LLaVA CLIP tower: {exc}") from exc
    return model.to(dtype).eval()
