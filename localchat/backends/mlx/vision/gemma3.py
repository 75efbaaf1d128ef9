"""Gemma 3's image encoder on MLX, the twin of localchat/backends/torch/vision/gemma3.py: a SigLIP ViT
(patch embedding, learned positions, pre-norm layers with bidirectional attention, gelu-tanh MLP, final
LayerNorm), then the projector (average pool of the patch grid to mm_tokens_per_image, Gemma RMSNorm with
(1 + weight), a matrix into the text model's width). Weights are kept under the checkpoint's own names."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn

# Where the tower and the projector sit in a checkpoint, longest first: the hub files (transformers 4.5x),
# then transformers 5's on-disk and in-memory names (the same table as the torch twin's).
_PREFIXES = (
    ("model.vision_tower.vision_model.", "vision_tower."),
    ("vision_tower.vision_model.", "vision_tower."),
    ("model.vision_tower.", "vision_tower."),
    ("vision_tower.", "vision_tower."),
    ("model.multi_modal_projector.", "multi_modal_projector."),
    ("multi_modal_projector.", "multi_modal_projector."),
)


def _our_name(key: str) -> str | None:
    for prefix, ours in _PREFIXES:
        if key.startswith(prefix):
            rest = key[len(prefix) :]
            return None if rest.startswith("head.") else ours + rest  # SigLIP's pooling head is unused
    return None


class Gemma3Vision:
    """pixel values [N, 3, S, S] -> image embeddings [N, mm_tokens_per_image, text hidden]."""

    def __init__(self, config: dict[str, Any], weights: dict[str, mx.array]) -> None:
        vision = config["vision_config"]
        self.patch = int(vision["patch_size"])
        self.image_size = int(vision["image_size"])
        self.grid = self.image_size // self.patch
        self.heads = int(vision["num_attention_heads"])
        self.layers = int(vision["num_hidden_layers"])
        self.eps = float(vision.get("layer_norm_eps", 1e-6))
        self.tokens_per_image = int(config.get("mm_tokens_per_image", 256))
        self.image_token_id = int(config.get("image_token_index", config.get("image_token_id", 262_144)))
        self.kernel = self.grid // round(self.tokens_per_image**0.5)
        self.w = weights
        hidden = int(vision["hidden_size"])
        # The patch conv has stride == kernel: one matmul over flattened (channel, row, col) patches.
        self.patch_matrix = weights["vision_tower.embeddings.patch_embedding.weight"].reshape(hidden, -1).T
        self.norm_scale = 1.0 + weights["multi_modal_projector.mm_soft_emb_norm.weight"]
        mx.eval(self.patch_matrix, self.norm_scale)

    def encode(self, pixels: mx.array) -> mx.array:
        return self._project(self._tower(pixels))

    def _tower(self, pixels: mx.array) -> mx.array:
        n, g, p = pixels.shape[0], self.grid, self.patch
        patches = pixels.reshape(n, 3, g, p, g, p).transpose(0, 2, 4, 1, 3, 5).reshape(n, g * g, 3 * p * p)
        emb = "vision_tower.embeddings."
        x = patches @ self.patch_matrix + self.w[emb + "patch_embedding.bias"]
        x = x + self.w[emb + "position_embedding.weight"]
        for i in range(self.layers):
            x = self._layer(x, f"vision_tower.encoder.layers.{i}.")
        return self._layer_norm(x, "vision_tower.post_layernorm.")

    def _layer(self, x: mx.array, at: str) -> mx.array:
        x = x + self._attention(self._layer_norm(x, at + "layer_norm1."), at + "self_attn.")
        h = self._linear(self._layer_norm(x, at + "layer_norm2."), at + "mlp.fc1.")
        return x + self._linear(mlx.nn.gelu_approx(h), at + "mlp.fc2.")

    def _attention(self, x: mx.array, at: str) -> mx.array:
        n, t, d = x.shape
        q, k, v = (
            self._linear(x, f"{at}{name}.").reshape(n, t, self.heads, -1).transpose(0, 2, 1, 3)
            for name in ("q_proj", "k_proj", "v_proj")
        )
        # every patch sees every patch: no mask
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=(d // self.heads) ** -0.5)
        return self._linear(out.transpose(0, 2, 1, 3).reshape(n, t, d), at + "out_proj.")

    def _project(self, patches: mx.array) -> mx.array:
        n, _, d = patches.shape
        side, k = self.grid // self.kernel, self.kernel
        # patch index = row * grid + col; average each k x k square of the grid
        pooled = patches.reshape(n, side, k, side, k, d).mean(axis=(2, 4)).reshape(n, side * side, d)
        normed = mx.fast.rms_norm(pooled.astype(mx.float32), self.norm_scale.astype(mx.float32), self.eps)
        return normed.astype(patches.dtype) @ self.w["multi_modal_projector.mm_input_projection_weight"]

    def _linear(self, x: mx.array, at: str) -> mx.array:
        return mx.addmm(self.w[at + "bias"], x, self.w[at + "weight"].T)

    def _layer_norm(self, x: mx.array, at: str) -> mx.array:
        return mx.fast.layer_norm(x, self.w[at + "weight"], self.w[at + "bias"], self.eps)


def load_gemma3_vision(folder: Path, dtype: mx.Dtype = mx.float32) -> Gemma3Vision:
    """The tower and projector of a Gemma3ForConditionalGeneration safetensors folder, evaluated now (so
    nothing lazy stays bound to the loading thread's stream)."""
    config = json.loads((folder / "config.json").read_text())
    weights: dict[str, mx.array] = {}
    for path in sorted(folder.glob("*.safetensors")):
        loaded = mx.load(str(path))
        assert isinstance(loaded, dict)
        for key, value in loaded.items():
            if (name := _our_name(key)) is not None:
                weights[name] = value.astype(dtype)
    mx.eval(list(weights.values()))
    missing = _expected_names(config) - weights.keys()
    if missing:  # a missing tensor is an error, not a random weight
        raise ValueError(f"{folder}: the vision tower lacks {', '.join(sorted(missing)[:5])}")
    return Gemma3Vision(config, weights)


def _expected_names(config: dict[str, Any]) -> set[str]:
    names = {
        "vision_tower.embeddings.patch_embedding.weight",
        "vision_tower.embeddings.patch_embedding.bias",
        "vision_tower.embeddings.position_embedding.weight",
        "vision_tower.post_layernorm.weight",
        "vision_tower.post_layernorm.bias",
        "multi_modal_projector.mm_input_projection_weight",
        "multi_modal_projector.mm_soft_emb_norm.weight",
    }
    attention = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj")
    parts = (*attention, "mlp.fc1", "mlp.fc2", "layer_norm1", "layer_norm2")
    for i in range(int(config["vision_config"]["num_hidden_layers"])):
        names |= {f"vision_tower.encoder.layers.{i}.{p}.{s}" for p in parts for s in ("weight", "bias")}
    return names
