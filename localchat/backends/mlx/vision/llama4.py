"""Llama 4's image encoder and projector on MLX, the twin of localchat/backends/torch/vision/llama4.py:
per tile the unfold patches and one matrix, a class token appended last, learned positions, LayerNorm,
encoder layers with 2-D rotary attention over adjacent pairs (the class token does not turn), LayerNorm,
the class token dropped, the pixel shuffle and the adapter's GELU MLP, then the projector's matrix."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from localchat.vision.llama4_mmproj import read_llama4_mmproj

LN_EPS = 1e-5  # transformers' LayerNorms here use torch's default eps
_PREFIXES = ("vision_model.", "multi_modal_projector.")


def _angles(vision: dict[str, Any]) -> np.ndarray:
    """[patches + 1, head_dim / 2] float32: x frequencies then y, position + 1; the class token (last) 0."""
    grid = int(vision["image_size"]) // int(vision["patch_size"])
    head_dim = int(vision["hidden_size"]) // int(vision["num_attention_heads"])
    half = head_dim // 2
    rope = vision.get("rope_parameters") or {}
    theta = float(rope.get("rope_theta", vision.get("rope_theta", 10000.0)))
    freq = (1.0 / (theta ** (np.arange(0, half, 2)[: half // 2].astype(np.float32) / half))).astype(
        np.float32
    )
    index = np.arange(grid * grid)
    x = np.repeat((index % grid + 1)[:, None].astype(np.float32) * freq, 2, axis=-1)
    y = np.repeat((index // grid + 1)[:, None].astype(np.float32) * freq, 2, axis=-1)
    angles = np.concatenate([x, y], axis=-1)[:, ::2]
    return np.concatenate([angles, np.zeros((1, angles.shape[1]), np.float32)])


class Llama4Vision:
    """pixel values [batch, tiles, 3, S, S] -> image rows [batch, tiles * tokens per tile, text hidden]."""

    def __init__(self, config: dict[str, Any], weights: dict[str, mx.array]) -> None:
        vision = config["vision_config"]
        if vision.get("hidden_act", "gelu") != "gelu":
            raise ValueError(
                f"Llama 4 vision tower with hidden_act {vision['hidden_act']!r} is not supported"
            )
        self.patch = int(vision["patch_size"])
        self.heads = int(vision["num_attention_heads"])
        self.layers = int(vision["num_hidden_layers"])
        self.ratio = float(vision.get("pixel_shuffle_ratio", 0.5))
        self.w = weights
        angles = _angles(vision)
        self.cos, self.sin = mx.array(np.cos(angles)), mx.array(np.sin(angles))

    def _ln(self, x: mx.array, name: str) -> mx.array:
        return mx.fast.layer_norm(x, self.w[name + ".weight"], self.w[name + ".bias"], LN_EPS)

    def _linear(self, x: mx.array, name: str, bias: bool = True) -> mx.array:
        out = x @ self.w[name + ".weight"].T
        return out + self.w[name + ".bias"] if bias else out

    def _turn(self, x: mx.array) -> mx.array:
        """x [n, T, heads, head_dim]: each adjacent pair turned by its angle (float32)."""
        pairs = x.astype(mx.float32).reshape(*x.shape[:-1], -1, 2)
        a, b = pairs[..., 0], pairs[..., 1]
        cos, sin = self.cos[None, :, None, :], self.sin[None, :, None, :]
        return mx.stack([a * cos - b * sin, a * sin + b * cos], axis=-1).reshape(x.shape).astype(x.dtype)

    def _layer(self, x: mx.array, i: int) -> mx.array:
        p = f"vision_model.model.layers.{i}."
        h = self._ln(x, p + "input_layernorm")
        n, t, d = h.shape
        shape = (n, t, self.heads, d // self.heads)
        q = self._turn(self._linear(h, p + "self_attn.q_proj").reshape(shape)).transpose(0, 2, 1, 3)
        k = self._turn(self._linear(h, p + "self_attn.k_proj").reshape(shape)).transpose(0, 2, 1, 3)
        v = self._linear(h, p + "self_attn.v_proj").reshape(shape).transpose(0, 2, 1, 3)
        att = mx.fast.scaled_dot_product_attention(q, k, v, scale=1 / math.sqrt(d // self.heads))
        x = x + self._linear(att.transpose(0, 2, 1, 3).reshape(n, t, d), p + "self_attn.o_proj")
        h = self._ln(x, p + "post_attention_layernorm")
        return x + self._linear(nn.gelu(self._linear(h, p + "mlp.fc1")), p + "mlp.fc2")

    def _adapter(self, x: mx.array) -> mx.array:
        n, count, d = x.shape
        g, r = round(count**0.5), self.ratio
        x = x.reshape(n, g, int(g * r), int(d / r)).transpose(0, 2, 1, 3)
        x = x.reshape(n, int(g * r), int(g * r), int(d / (r * r))).transpose(0, 2, 1, 3)
        x = x.reshape(n, -1, x.shape[-1])
        a = "vision_model.vision_adapter.mlp."
        return nn.gelu(self._linear(nn.gelu(self._linear(x, a + "fc1", False)), a + "fc2", False))

    def encode(self, pixels: mx.array) -> mx.array:
        batch, tiles, c, size = pixels.shape[:4]
        n, g, p = batch * tiles, size // self.patch, self.patch
        # torch's unfold order: patches row-major, each patch channel-major (c, kh, kw)
        patches = pixels.reshape(n, c, g, p, g, p).transpose(0, 2, 4, 1, 3, 5).reshape(n, g * g, c * p * p)
        x = self._linear(patches, "vision_model.patch_embedding.linear", False)
        cls = mx.broadcast_to(self.w["vision_model.class_embedding"], (n, 1, x.shape[-1]))
        x = mx.concatenate([x, cls], axis=1) + self.w["vision_model.positional_embedding_vlm"]
        x = self._ln(x, "vision_model.layernorm_pre")
        for i in range(self.layers):
            x = self._layer(x, i)
        x = self._adapter(self._ln(x, "vision_model.layernorm_post")[:, :-1])
        rows = self._linear(x, "multi_modal_projector.linear_1", False)
        return rows.reshape(batch, -1, rows.shape[-1])


def load_llama4_vision(folder: Path, dtype: mx.Dtype = mx.float32) -> Llama4Vision | None:
    """The tower and projector of a Llama4ForConditionalGeneration safetensors folder, evaluated now; None
    when its files hold no vision tensor at all (a text-only export that keeps the multimodal config)."""
    weights: dict[str, mx.array] = {}
    for path in sorted(folder.glob("*.safetensors")):
        loaded = mx.load(str(path))
        assert isinstance(loaded, dict)
        weights.update({k: v.astype(dtype) for k, v in loaded.items() if k.startswith(_PREFIXES)})
    if not weights:
        return None
    config = json.loads((folder / "config.json").read_text())
    missing = _expected_names(config) - weights.keys()
    if missing:  # a missing tensor is an error, not a random weight
        raise ValueError(f"{folder}: the Llama 4 vision tower lacks {', '.join(sorted(missing)[:5])}")
    mx.eval(list(weights.values()))
    return Llama4Vision(config, weights)


def load_llama4_mmproj(config: dict[str, Any], mmproj: Path, dtype: mx.Dtype = mx.float32) -> Llama4Vision:
    """The same tower from llama.cpp's `llama4` mmproj (`config`: localchat.vision.mmproj's dict for the
    pair), renamed onto the checkpoint's names as on torch (localchat/vision/llama4_mmproj.py)."""
    weights = {name: mx.array(values).astype(dtype) for name, values in read_llama4_mmproj(mmproj).items()}
    missing = _expected_names(config) - weights.keys()
    if missing:  # a missing tensor is an error, not a random weight
        raise ValueError(f"{mmproj.name}: the Llama 4 vision tower lacks {', '.join(sorted(missing)[:5])}")
    mx.eval(list(weights.values()))
    return Llama4Vision(config, weights)


def _expected_names(config: dict[str, Any]) -> set[str]:
    v = "vision_model."
    names = {
        v + "patch_embedding.linear.weight",
        v + "class_embedding",
        v + "positional_embedding_vlm",
        v + "vision_adapter.mlp.fc1.weight",
        v + "vision_adapter.mlp.fc2.weight",
        "multi_modal_projector.linear_1.weight",
    }
    names |= {f"{v}{ln}.{s}" for ln in ("layernorm_pre", "layernorm_post") for s in ("weight", "bias")}
    attention = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
    parts = (*attention, "mlp.fc1", "mlp.fc2", "input_layernorm", "post_attention_layernorm")
    for i in range(int(config["vision_config"]["num_hidden_layers"])):
        names |= {f"{v}model.layers.{i}.{p}.{s}" for p in parts for s in ("weight", "bias")}
    return names
