"""Mistral Small 3.x's image encoder on MLX, the twin of localchat/backends/torch/vision/pixtral.py: the
Pixtral ViT (patch conv without bias as one matmul, an RMSNorm before the encoder, pre-RMSNorm layers with
bidirectional attention, 2-D rotary positions over (row, column), gated MLPs) over a picture at its own
size, then Mistral 3's projector (RMSNorm, the spatial_merge x spatial_merge patch merger, linear-act-
linear). Weights are kept under the checkpoint's own names."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn
import numpy as np

from localchat.vision.pixtral_mmproj import read_pixtral_mmproj

# Where the tower and the projector sit in a checkpoint (the torch twin's table).
_PREFIXES = (
    ("model.vision_tower.", "vision_tower."),
    ("vision_tower.", "vision_tower."),
    ("model.multi_modal_projector.", "multi_modal_projector."),
    ("multi_modal_projector.", "multi_modal_projector."),
)
_ACTIVATIONS: dict[str, Callable[[mx.array], mx.array]] = {
    "gelu": mlx.nn.gelu,
    "gelu_pytorch_tanh": mlx.nn.gelu_approx,
    "gelu_new": mlx.nn.gelu_approx,
    "silu": mlx.nn.silu,
    "quick_gelu": lambda x: x * mx.sigmoid(1.702 * x),
}


def _activation(name: str) -> Callable[[mx.array], mx.array]:
    if name not in _ACTIVATIONS:
        raise ValueError(f"unsupported activation {name!r} (localchat runs {', '.join(_ACTIVATIONS)})")
    return _ACTIVATIONS[name]


def _feature_layer(config: dict[str, Any]) -> int:
    layer = config.get("vision_feature_layer", -1)
    if not isinstance(layer, int):
        raise ValueError(f"vision_feature_layer {layer!r}: Mistral 3's projector takes one layer")
    depth = int(config["vision_config"]["num_hidden_layers"])
    return layer if layer >= 0 else depth + 1 + layer


def _rope_theta(vision: dict[str, Any]) -> float:
    params = vision.get("rope_parameters") or {}
    return float(params.get("rope_theta", vision.get("rope_theta", 10_000.0)))


def _axial_angles(rows: int, columns: int, head_dim: int, theta: float) -> np.ndarray:
    """[rows * columns, head_dim]: even frequencies turn with the row, odd ones with the column."""
    freqs = (1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))).astype(np.float32)
    row = np.arange(rows, dtype=np.float32)[:, None] * freqs[0::2]
    col = np.arange(columns, dtype=np.float32)[:, None] * freqs[1::2]
    half = np.concatenate(
        [
            np.broadcast_to(row[:, None], (rows, columns, row.shape[1])),
            np.broadcast_to(col[None], (rows, columns, col.shape[1])),
        ],
        axis=-1,
    ).reshape(rows * columns, head_dim // 2)
    return np.concatenate([half, half], axis=-1)


def _rotate_half(x: mx.array) -> mx.array:
    half = x.shape[-1] // 2
    return mx.concatenate([-x[..., half:], x[..., :half]], axis=-1)


class PixtralVision:
    """pixel values [N, 3, H, W] of same-sized pictures (sides multiples of patch x merge) -> image
    embeddings [N, (H / unit) * (W / unit), text hidden], row-major like the prompt's `[IMG]` tokens."""

    def __init__(self, config: dict[str, Any], weights: dict[str, mx.array]) -> None:
        vision = config["vision_config"]
        self.patch = int(vision["patch_size"])
        self.heads = int(vision["num_attention_heads"])
        self.theta = _rope_theta(vision)
        self.act = _activation(str(vision.get("hidden_act", "gelu")))
        self.projector_act = _activation(str(config.get("projector_hidden_act", "gelu")))
        self.merge = int(config.get("spatial_merge_size", 2))
        self.feature_layer = _feature_layer(config)
        self.projector_eps = float(config["text_config"].get("rms_norm_eps", 1e-5))
        self.w = weights
        hidden = int(vision["hidden_size"])
        # The patch conv has stride == kernel: one matmul over flattened (channel, row, col) patches.
        self.patch_matrix = weights["vision_tower.patch_conv.weight"].reshape(hidden, -1).T
        mx.eval(self.patch_matrix)

    def encode(self, pixels: mx.array) -> mx.array:
        rows, columns = pixels.shape[-2] // self.patch, pixels.shape[-1] // self.patch
        x = self._tower(pixels, rows, columns)
        at = "multi_modal_projector."
        x = mx.fast.rms_norm(x, self.w[at + "norm.weight"], self.projector_eps)
        n, _, d = x.shape
        m = self.merge
        blocks = x.reshape(n, rows // m, m, columns // m, m, d).transpose(0, 1, 3, 5, 2, 4)
        merged = self._linear(
            blocks.reshape(n, (rows // m) * (columns // m), d * m * m), at + "patch_merger.merging_layer."
        )
        h = self._linear(merged, at + "linear_1.")
        return self._linear(self.projector_act(h), at + "linear_2.")

    def _tower(self, pixels: mx.array, rows: int, columns: int) -> mx.array:
        n, p = pixels.shape[0], self.patch
        patches = pixels.reshape(n, 3, rows, p, columns, p).transpose(0, 2, 4, 1, 3, 5)
        x = patches.reshape(n, rows * columns, 3 * p * p) @ self.patch_matrix
        x = mx.fast.rms_norm(x, self.w["vision_tower.ln_pre.weight"], 1e-5)
        angles = mx.array(_axial_angles(rows, columns, x.shape[-1] // self.heads, self.theta))
        cos, sin = mx.cos(angles).astype(x.dtype), mx.sin(angles).astype(x.dtype)
        for i in range(self.feature_layer):  # the layers past the feature layer never run
            x = self._layer(x, f"vision_tower.transformer.layers.{i}.", cos, sin)
        return x

    def _layer(self, x: mx.array, at: str, cos: mx.array, sin: mx.array) -> mx.array:
        h = mx.fast.rms_norm(x, self.w[at + "attention_norm.weight"], 1e-5)
        x = x + self._attention(h, at + "attention.", cos, sin)
        h = mx.fast.rms_norm(x, self.w[at + "ffn_norm.weight"], 1e-5)
        ff = at + "feed_forward."
        gated = self.act(self._linear(h, ff + "gate_proj.")) * self._linear(h, ff + "up_proj.")
        return x + self._linear(gated, ff + "down_proj.")

    def _attention(self, x: mx.array, at: str, cos: mx.array, sin: mx.array) -> mx.array:
        n, t, d = x.shape
        q, k, v = (
            self._linear(x, f"{at}{name}.").reshape(n, t, self.heads, -1).transpose(0, 2, 1, 3)
            for name in ("q_proj", "k_proj", "v_proj")
        )
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        # one picture per row: every patch sees every patch, no mask
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=(d // self.heads) ** -0.5)
        return self._linear(out.transpose(0, 2, 1, 3).reshape(n, t, d), at + "o_proj.")

    def _linear(self, x: mx.array, at: str) -> mx.array:
        bias = self.w.get(at + "bias")
        weight = self.w[at + "weight"].T
        return x @ weight if bias is None else mx.addmm(bias, x, weight)


def _our_name(key: str) -> str | None:
    for prefix, ours in _PREFIXES:
        if key.startswith(prefix):
            return ours + key[len(prefix) :]
    return None


def _expected_names(config: dict[str, Any]) -> set[str]:
    at = "multi_modal_projector."
    names = {"vision_tower.patch_conv.weight", "vision_tower.ln_pre.weight", at + "norm.weight"}
    names.add(at + "patch_merger.merging_layer.weight")
    bias = bool(config.get("multimodal_projector_bias", False))
    for linear in ("linear_1", "linear_2"):
        names |= {f"{at}{linear}.{s}" for s in (("weight", "bias") if bias else ("weight",))}
    attention = [f"attention.{name}" for name in ("q_proj", "k_proj", "v_proj", "o_proj")]
    mlp = [f"feed_forward.{name}" for name in ("gate_proj", "up_proj", "down_proj")]
    parts = [*attention, *mlp, "attention_norm", "ffn_norm"]
    for i in range(_feature_layer(config)):
        names |= {f"vision_tower.transformer.layers.{i}.{p}.weight" for p in parts}
    return names


def load_pixtral_vision(folder: Path, dtype: mx.Dtype = mx.float32) -> PixtralVision:
    """The tower and projector of a Mistral3ForConditionalGeneration safetensors folder."""
    config = json.loads((folder / "config.json").read_text())
    wanted = _expected_names(config)
    weights: dict[str, mx.array] = {}
    for path in sorted(folder.glob("*.safetensors")):
        loaded = mx.load(str(path))
        assert isinstance(loaded, dict)
        for key, value in loaded.items():
            if (name := _our_name(key)) is not None and name in wanted:
                weights[name] = value.astype(dtype)
    mx.eval(list(weights.values()))  # evaluated now: nothing lazy stays bound to the loading thread's stream
    missing = wanted - weights.keys()
    if missing:  # a missing tensor is an error, not a random weight
        raise ValueError(f"{folder}: the vision tower lacks {', '.join(sorted(missing)[:5])}")
    return PixtralVision(config, weights)


def load_pixtral_mmproj(config: dict[str, Any], mmproj: Path, dtype: mx.Dtype = mx.float32) -> PixtralVision:
    """The same tower from llama.cpp's `pixtral` mmproj (config: mmproj.py's gguf_vision_config dict)."""
    state = read_pixtral_mmproj(config, mmproj)
    wanted = _expected_names(config)
    missing = wanted - state.keys()
    if missing:  # a missing tensor is an error, not a random weight
        raise ValueError(f"{mmproj}: the vision tower lacks {', '.join(sorted(missing)[:5])}")
    weights = {name: mx.array(state[name]).astype(dtype) for name in wanted}
    mx.eval(list(weights.values()))
    return PixtralVision(config, weights)
