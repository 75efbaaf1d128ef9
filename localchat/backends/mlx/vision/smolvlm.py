"""SmolVLM's and Idefics3's image encoder on MLX, the twin of localchat/backends/torch/vision/smolvlm.py:
Gemma 3's SigLIP tower (backends/mlx/vision/gemma3.py, reused as is) run on each tile of a picture, then
the connector: a pixel shuffle folding each scale x scale block of patches into one row, and a matrix
without bias into the text model's width."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx

from localchat.backends.mlx.vision.gemma3 import Gemma3Vision
from localchat.vision.smolvlm_mmproj import read_smolvlm_mmproj
from localchat.vision.smolvlm_prompt import vision_settings

# The checkpoint's names -> the names Gemma3Vision's tower reads (and the connector's own).
_PREFIXES = (("model.vision_model.", "vision_tower."), ("model.connector.", "connector."))
_PROJECTION = "connector.modality_projection.proj.weight"


class SmolVLMVision(Gemma3Vision):
    """pixel values [batch, tiles, 3, S, S] -> image embeddings [batch, tiles * tokens per tile, hidden].
    Inherits Gemma 3's tower (`_tower`); its own __init__ sets the fields that tower reads, with no
    Gemma 3 projector."""

    def __init__(self, config: dict[str, Any], weights: dict[str, mx.array]) -> None:
        vision = vision_settings(config)
        if vision["hidden_act"] != "gelu_pytorch_tanh":
            raise ValueError(
                f"SmolVLM vision tower with hidden_act {vision['hidden_act']!r} is not supported"
            )
        self.patch = int(vision["patch_size"])
        self.image_size = int(vision["image_size"])
        self.grid = self.image_size // self.patch
        self.heads = int(vision["num_attention_heads"])
        self.layers = int(vision["num_hidden_layers"])
        self.eps = float(vision.get("layer_norm_eps", 1e-6))
        self.scale = int(config.get("scale_factor", 2))
        self.w = weights
        hidden = int(vision["hidden_size"])
        self.patch_matrix = weights["vision_tower.embeddings.patch_embedding.weight"].reshape(hidden, -1).T
        self.projection = weights[_PROJECTION].T
        mx.eval(self.patch_matrix, self.projection)

    def encode(self, pixels: mx.array) -> mx.array:
        batch, tiles = pixels.shape[:2]
        patches = self._tower(pixels.reshape(batch * tiles, *pixels.shape[2:]))
        n, count, d = patches.shape
        g, s = self.grid, self.scale
        # each s x s block of the patch grid -> one row, its patches concatenated row-major
        blocks = patches.reshape(n, g // s, s, g // s, s, d).transpose(0, 1, 3, 2, 4, 5)
        rows = blocks.reshape(n, count // (s * s), d * s * s) @ self.projection
        return rows.reshape(batch, -1, rows.shape[-1])


def load_smolvlm_vision(folder: Path, dtype: mx.Dtype = mx.float32) -> SmolVLMVision:
    """The tower and connector of a SmolVLMForConditionalGeneration / Idefics3ForConditionalGeneration
    safetensors folder, evaluated now."""
    checkpoint: dict[str, mx.array] = {}
    for path in sorted(folder.glob("*.safetensors")):
        loaded = mx.load(str(path))
        assert isinstance(loaded, dict)
        checkpoint.update(loaded)
    return _load(json.loads((folder / "config.json").read_text()), checkpoint, dtype, str(folder))


def load_smolvlm_mmproj(config: dict[str, Any], mmproj: Path, dtype: mx.Dtype = mx.float32) -> SmolVLMVision:
    """The same from llama.cpp's `idefics3` mmproj; `config`: localchat.vision.mmproj's dict for the pair."""
    checkpoint = {name: mx.array(values) for name, values in read_smolvlm_mmproj(mmproj).items()}
    return _load(config, checkpoint, dtype, mmproj.name)


def _load(
    config: dict[str, Any], checkpoint: dict[str, mx.array], dtype: mx.Dtype, source: str
) -> SmolVLMVision:
    weights = {
        ours + key[len(prefix) :]: value.astype(dtype)
        for key, value in checkpoint.items()
        for prefix, ours in _PREFIXES
        if key.startswith(prefix)
    }
    mx.eval(list(weights.values()))
    missing = _expected_names(config) - weights.keys()
    if missing:  # a missing tensor is an error, not a random weight
        raise ValueError(f"{source}: the vision tower lacks {', '.join(sorted(missing)[:5])}")
    return SmolVLMVision(config, weights)


def _expected_names(config: dict[str, Any]) -> set[str]:
    emb = "vision_tower.embeddings."
    names = {
        emb + "patch_embedding.weight",
        emb + "patch_embedding.bias",
        emb + "position_embedding.weight",
        "vision_tower.post_layernorm.weight",
        "vision_tower.post_layernorm.bias",
        _PROJECTION,
    }
    attention = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj")
    parts = (*attention, "mlp.fc1", "mlp.fc2", "layer_norm1", "layer_norm2")
    for i in range(int(vision_settings(config)["num_hidden_layers"])):
        names |= {f"vision_tower.encoder.layers.{i}.{p}.{s}" for p in parts for s in ("weight", "bias")}
    return names
