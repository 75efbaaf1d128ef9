"""The Qwen2-VL / Qwen2.5-VL / Qwen3-VL tower from llama.cpp's mmproj GGUF on torch: the tensors under the
tower's names (localchat/vision/qwen_vl_mmproj.py) loaded into qwen_vl.py's QwenVisionTower, so the GGUF
pair and a safetensors folder run the same tower and give the same embeddings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from localchat.backends.torch.vision.qwen_vl import QwenVisionTower
from localchat.errors import ModelLoadError
from localchat.vision.qwen_vl_mmproj import read_qwen_vl_mmproj


def load_qwen_vl_mmproj(
    config: dict[str, Any], mmproj: Path, dtype: torch.dtype = torch.float32
) -> QwenVisionTower:
    """`config`: localchat.vision.mmproj.gguf_vision_config's dict for the pair."""
    kind = config["model_type"]
    qwen3 = kind not in ("qwen2_vl", "qwen2_5_vl")  # Qwen3-VL's tower, also Qwen3.5's
    tower = QwenVisionTower(config["vision_config"], qwen3=qwen3, qwen2=kind == "qwen2_vl")
    state = {name: torch.from_numpy(values) for name, values in read_qwen_vl_mmproj(config, mmproj).items()}
    try:
        tower.load_state_dict(state, strict=True)  # a missing tensor is an error, not a random weight
    except RuntimeError as exc:
        raise ModelLoadError(f"{mmproj.name} does not hold a {kind} vision tower: {exc}") from exc
    return tower.to(dtype).eval()
