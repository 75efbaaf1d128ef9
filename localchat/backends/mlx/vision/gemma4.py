"""Gemma 4's image encoder and embedder on MLX, the twin of localchat/backends/torch/vision/gemma4.py: a
linear patch projection of 2 * (pixels - 0.5) plus learned x and y rows; pre/post-normed layers (RMSNorm
times its weight) with q/k norms, a weightless v norm, a 2-D rotary (the first half of each head turns with
the patch's column, the second with its row), unscaled bidirectional attention and a GeGLU MLP, linears
optionally clamped; a kernel x kernel average pool times sqrt(hidden), optionally standardized; then a
weightless RMSNorm and a matrix into the text model's width. Weights keep the checkpoint's own names."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn

from localchat.vision.gemma4_mmproj import gemma4_tensors
from localchat.weights.gguf import open_gguf

_PREFIXES = (
    ("model.vision_tower.", "vision_tower."),
    ("model.embed_vision.", "embed_vision."),
    ("vision_tower.", "vision_tower."),
    ("embed_vision.", "embed_vision."),
)
_LINEARS: tuple[str, ...] = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
_LINEARS += ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
_NORMS: tuple[str, ...] = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm")
_NORMS += ("post_feedforward_layernorm", "self_attn.q_norm", "self_attn.k_norm")


def _our_name(key: str) -> str | None:
    for prefix, ours in _PREFIXES:
        if key.startswith(prefix):
            return ours + key[len(prefix) :]
    return None


def _rms_norm(x: mx.array, weight: mx.array | None, eps: float) -> mx.array:
    """transformers' Gemma4RMSNorm: in float32, x * (mean(x^2) + eps) ** -0.5, times the weight itself."""
    f = x.astype(mx.float32)
    out = f * mx.power(mx.mean(f * f, axis=-1, keepdims=True) + eps, -0.5)
    return (out if weight is None else out * weight.astype(mx.float32)).astype(x.dtype)


def _rotate(x: mx.array, cos: mx.array, sin: mx.array) -> mx.array:
    half = x.shape[-1] // 2
    return x * cos + mx.concatenate([-x[..., half:], x[..., :half]], axis=-1) * sin


class Gemma4Vision:
    """pixel values [N, 3, H, W] (pictures of one size) -> image embeddings [N, soft tokens, text hidden]."""

    def __init__(self, config: dict[str, Any], weights: dict[str, mx.array]) -> None:
        vision = config["vision_config"]
        self.hidden = int(vision["hidden_size"])
        self.heads = int(vision["num_attention_heads"])
        self.kv_heads = int(vision.get("num_key_value_heads", self.heads))
        self.head_dim = int(vision.get("head_dim") or self.hidden // self.heads)
        self.layers = int(vision["num_hidden_layers"])
        self.patch = int(vision.get("patch_size", 16))
        self.kernel = int(vision.get("pooling_kernel_size", 3))
        self.eps = float(vision.get("rms_norm_eps", 1e-6))
        self.clipped = bool(vision.get("use_clipped_linears", False))
        self.standardize = bool(vision.get("standardize", False))
        self.approximate = str(vision.get("hidden_activation", "gelu_pytorch_tanh")) in (
            "gelu_pytorch_tanh",
            "gelu_new",
        )
        self.image_token_id = int(config.get("image_token_id", 258_880))
        theta = float((vision.get("rope_parameters") or {}).get("rope_theta", 100.0))
        quarter = self.head_dim // 2  # each axis turns half a head: head_dim / 4 frequencies
        self.inv_freq = 1.0 / (theta ** (mx.arange(0, quarter, 2, dtype=mx.float32) / quarter))
        self.w = weights

    def encode(self, pixels: mx.array) -> mx.array:
        return mx.stack([self._embed(self._tower(pixels[i])) for i in range(pixels.shape[0])])

    def _tower(self, pixels: mx.array) -> mx.array:
        _, h, w = pixels.shape
        rows, cols, p = h // self.patch, w // self.patch, self.patch
        tiles = pixels.reshape(3, rows, p, cols, p).transpose(1, 3, 2, 4, 0).reshape(rows * cols, -1)
        xs = mx.tile(mx.arange(cols), rows)
        ys = mx.repeat(mx.arange(rows), cols)
        at = "vision_tower.patch_embedder."
        x = (2 * (tiles - 0.5)).astype(self.w[at + "input_proj.weight"].dtype) @ self.w[
            at + "input_proj.weight"
        ].T
        table = self.w[at + "position_embedding_table"]
        x = x + table[0][xs] + table[1][ys]
        fx = xs.astype(mx.float32)[:, None] * self.inv_freq
        fy = ys.astype(mx.float32)[:, None] * self.inv_freq
        angles = mx.concatenate([fx, fx, fy, fy], axis=-1)
        cos, sin = mx.cos(angles).astype(x.dtype), mx.sin(angles).astype(x.dtype)
        for i in range(self.layers):
            x = self._layer(x, cos, sin, f"vision_tower.encoder.layers.{i}.")
        k = self.kernel  # average each k x k block of patches, blocks in row-major order
        d = x.shape[-1]
        pooled = x.astype(mx.float32).reshape(rows // k, k, cols // k, k, d).mean(axis=(1, 3)).reshape(-1, d)
        pooled = pooled * self.hidden**0.5
        if self.standardize:
            pooled = (pooled - self.w["vision_tower.std_bias"].astype(mx.float32)) * self.w[
                "vision_tower.std_scale"
            ].astype(mx.float32)
        return pooled.astype(x.dtype)

    def _embed(self, x: mx.array) -> mx.array:
        return _rms_norm(x, None, self.eps) @ self.w["embed_vision.embedding_projection.weight"].T

    def _layer(self, x: mx.array, cos: mx.array, sin: mx.array, at: str) -> mx.array:
        attn = self._attention(self._norm(x, at + "input_layernorm"), cos, sin, at + "self_attn.")
        x = x + self._norm(attn, at + "post_attention_layernorm")
        h = self._norm(x, at + "pre_feedforward_layernorm")
        gate = (
            mlx.nn.gelu_approx(self._linear(h, at + "mlp.gate_proj"))
            if self.approximate
            else mlx.nn.gelu(self._linear(h, at + "mlp.gate_proj"))
        )
        mlp = self._linear(gate * self._linear(h, at + "mlp.up_proj"), at + "mlp.down_proj")
        return x + self._norm(mlp, at + "post_feedforward_layernorm")

    def _attention(self, x: mx.array, cos: mx.array, sin: mx.array, at: str) -> mx.array:
        t, d = x.shape[0], self.head_dim
        q = self._turn(
            self._norm(self._linear(x, at + "q_proj").reshape(t, self.heads, d), at + "q_norm"), cos, sin
        )
        k = self._linear(x, at + "k_proj").reshape(t, self.kv_heads, d)
        k = self._turn(self._norm(k, at + "k_norm"), cos, sin)
        v = _rms_norm(self._linear(x, at + "v_proj").reshape(t, self.kv_heads, d), None, self.eps)
        q, k, v = (z.transpose(1, 0, 2)[None] for z in (q, k, v))
        # every patch sees every patch, scores unscaled (grouped KV heads are native to the kernel)
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=1.0)
        return self._linear(out[0].transpose(1, 0, 2).reshape(t, self.heads * d), at + "o_proj")

    @staticmethod
    def _turn(x: mx.array, cos: mx.array, sin: mx.array) -> mx.array:
        half = x.shape[-1] // 2
        c, s = cos[:, None, :], sin[:, None, :]
        return mx.concatenate(
            [
                _rotate(x[..., :half], c[..., :half], s[..., :half]),
                _rotate(x[..., half:], c[..., half:], s[..., half:]),
            ],
            axis=-1,
        )

    def _linear(self, x: mx.array, at: str) -> mx.array:
        if not self.clipped:
            return x @ self.w[at + ".linear.weight"].T
        x = mx.clip(x, self.w[at + ".input_min"], self.w[at + ".input_max"])
        return mx.clip(
            x @ self.w[at + ".linear.weight"].T, self.w[at + ".output_min"], self.w[at + ".output_max"]
        )

    def _norm(self, x: mx.array, at: str) -> mx.array:
        return _rms_norm(x, self.w[at + ".weight"], self.eps)


def load_gemma4_vision(folder: Path, dtype: mx.Dtype = mx.float32) -> Gemma4Vision | None:
    """The tower and embedder of a Gemma4ForConditionalGeneration safetensors folder, evaluated now (so
    nothing lazy stays bound to the loading thread's stream); None when the folder holds no tower."""
    config = json.loads((folder / "config.json").read_text())
    weights: dict[str, mx.array] = {}
    for path in sorted(folder.glob("*.safetensors")):
        loaded = mx.load(str(path))
        assert isinstance(loaded, dict)
        for key, value in loaded.items():
            if (name := _our_name(key)) is not None:
                weights[name] = value.astype(dtype)
    if not any(name.startswith("vision_tower.") for name in weights):
        return None
    mx.eval(list(weights.values()))
    missing = _expected_names(config) - weights.keys()
    if missing:  # a missing tensor is an error, not a random weight
        raise ValueError(f"{folder}: the vision tower lacks {', '.join(sorted(missing)[:5])}")
    return Gemma4Vision(config, weights)


def load_gemma4_mmproj(config: dict[str, Any], mmproj: Path, dtype: mx.Dtype = mx.float32) -> Gemma4Vision:
    """The tower and embedder from llama.cpp's `gemma4v` mmproj (`config`: localchat.vision.mmproj's dict
    for the pair), renamed onto the checkpoint's names as on torch (localchat/vision/gemma4_mmproj.py)."""
    weights = {
        name: mx.array(values).astype(dtype)
        for name, values in gemma4_tensors(mmproj, open_gguf(mmproj).tensors).items()
    }
    mx.eval(list(weights.values()))
    missing = _expected_names(config) - weights.keys()
    if missing:  # a missing tensor is an error, not a random weight
        raise ValueError(f"{mmproj.name}: the vision tower lacks {', '.join(sorted(missing)[:5])}")
    return Gemma4Vision(config, weights)


def _expected_names(config: dict[str, Any]) -> set[str]:
    vision = config["vision_config"]
    names = {
        "vision_tower.patch_embedder.input_proj.weight",
        "vision_tower.patch_embedder.position_embedding_table",
        "embed_vision.embedding_projection.weight",
    }
    if vision.get("standardize"):
        names |= {"vision_tower.std_bias", "vision_tower.std_scale"}
    suffixes = [".linear.weight"]
    if vision.get("use_clipped_linears"):
        suffixes += [".input_min", ".input_max", ".output_min", ".output_max"]
    for i in range(int(vision["num_hidden_layers"])):
        at = f"vision_tower.encoder.layers.{i}."
        names |= {at + p + s for p in _LINEARS for s in suffixes} | {f"{at}{n}.weight" for n in _NORMS}
    return names
