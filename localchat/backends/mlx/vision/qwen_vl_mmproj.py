"""The Qwen2-VL / Qwen2.5-VL / Qwen3-VL tower from llama.cpp's mmproj GGUF on MLX, the twin of
backends/torch/vision/qwen_vl_mmproj.py: the tensors (localchat/vision/qwen_vl_mmproj.py) under the
checkpoint's names that qwen_vl.py's QwenVision reads, so the pair and a safetensors folder run one tower."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx

from localchat.backends.mlx.vision.qwen_vl import QwenVision
from localchat.errors import ModelLoadError
from localchat.vision.qwen_vl_mmproj import read_qwen_vl_mmproj

# The torch tower's names that differ from the checkpoint's (the Conv3d held as its flattened matrix).
_RENAMES = {"patch_embed.weight": "patch_embed.proj.weight", "patch_embed.bias": "patch_embed.proj.bias"}


def load_qwen_vl_mmproj(config: dict[str, Any], mmproj: Path, dtype: mx.Dtype = mx.float32) -> QwenVision:
    """`config`: localchat.vision.mmproj.gguf_vision_config's dict for the pair."""
    state = read_qwen_vl_mmproj(config, mmproj)
    weights = {_RENAMES.get(name, name): mx.array(values).astype(dtype) for name, values in state.items()}
    depth = int(config["vision_config"]["depth"])
    qwen3 = config["model_type"] not in ("qwen2_vl", "qwen2_5_vl")  # Qwen3-VL's tower, also Qwen3.5's
    needed = {"merger.linear_fc1.weight" if qwen3 else "merger.mlp.0.weight"}
    needed |= {f"blocks.{i}.attn.qkv.weight" for i in range(depth)}
    if missing := sorted(needed - set(weights)):  # found now, not as a KeyError on the first picture
        raise ModelLoadError(
            f"{mmproj.name} does not hold a {config['model_type']} vision tower: lacks {missing}"
        )
    mx.eval(list(weights.values()))
    return QwenVision(config, weights)
