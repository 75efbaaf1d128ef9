"""LLaVA's image encoder on MLX, the twin of localchat/backends/torch/vision/llava.py: a CLIP ViT (patch
embedding without bias, a class token, learned positions, a LayerNorm before the encoder, pre-norm layers
with bidirectional attention and quick_gelu MLPs), the hidden states at `vision_feature_layer` (CLS row
dropped under the "default" strategy), then the 2-layer GELU projector. Weights are kept under the
checkpoint's own names, from a safetensors folder or llama.cpp's mmproj (localchat/vision/llava_mmproj.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn

from localchat.vision.llava_mmproj import read_llava_mmproj

# Where the tower and the projector sit in a checkpoint, longest first (the torch twin's table).
_PREFIXES = (
    ("model.vision_tower.vision_model.", "vision_tower."),
    ("vision_tower.vision_model.", "vision_tower."),
    ("model.vision_tower.", "vision_tower."),
    ("vision_tower.", "vision_tower."),
    ("model.multi_modal_projector.", "multi_modal_projector."),
    ("multi_modal_projector.", "multi_modal_projector."),
)
_ACTIVATIONS: dict[str, Callable[[mx.array], mx.array]] = {
    "quick_gelu": lambda x: x * mx.sigmoid(1.702 * x),
    "gelu": mlx.nn.gelu,
    "gelu_pytorch_tanh": mlx.nn.gelu_approx,
    "gelu_new": mlx.nn.gelu_approx,
}


def _activation(name: str) -> Callable[[mx.array], mx.array]:
    if name not in _ACTIVATIONS:
        raise ValueError(f"unsupported activation {name!r} (localchat runs {', '.join(_ACTIVATIONS)})")
    return _ACTIVATIONS[name]


def _feature_layers(config: dict[str, Any]) -> list[int]:
    layer = config.get("vision_feature_layer", -2)
    depth = int(config["vision_config"]["num_hidden_layers"])
    layers = [int(layer)] if isinstance(layer, int) else [int(i) for i in layer]
    return [i if i >= 0 else depth + 1 + i for i in layers]


class LlavaVision:
    """pixel values [N, 3, S, S] -> image embeddings [N, patches (+ CLS under "full"), text hidden]."""

    def __init__(self, config: dict[str, Any], weights: dict[str, mx.array]) -> None:
        vision = config["vision_config"]
        self.patch = int(vision["patch_size"])
        self.grid = int(vision["image_size"]) // self.patch
        self.heads = int(vision["num_attention_heads"])
        self.eps = float(vision.get("layer_norm_eps", 1e-5))
        self.act = _activation(str(vision.get("hidden_act", "quick_gelu")))
        self.projector_act = _activation(str(config.get("projector_hidden_act", "gelu")))
        self.feature_layers = _feature_layers(config)
        self.drop_cls = config.get("vision_feature_select_strategy", "default") == "default"
        self.w = weights
        hidden = int(vision["hidden_size"])
        # The patch conv has stride == kernel: one matmul over flattened (channel, row, col) patches.
        self.patch_matrix = weights["vision_tower.embeddings.patch_embedding.weight"].reshape(hidden, -1).T
        mx.eval(self.patch_matrix)

    def encode(self, pixels: mx.array) -> mx.array:
        features = self._tower(pixels)
        features = features[:, 1:] if self.drop_cls else features
        h = self._linear(features, "multi_modal_projector.linear_1.")
        return self._linear(self.projector_act(h), "multi_modal_projector.linear_2.")

    def _tower(self, pixels: mx.array) -> mx.array:
        n, g, p = pixels.shape[0], self.grid, self.patch
        patches = pixels.reshape(n, 3, g, p, g, p).transpose(0, 2, 4, 1, 3, 5).reshape(n, g * g, 3 * p * p)
        emb = "vision_tower.embeddings."
        x = patches @ self.patch_matrix
        cls = mx.broadcast_to(self.w[emb + "class_embedding"].astype(x.dtype), (n, 1, x.shape[-1]))
        x = mx.concatenate([cls, x], axis=1) + self.w[emb + "position_embedding.weight"]
        x = self._layer_norm(x, "vision_tower.pre_layrnorm.")
        states = [x]
        for i in range(max(self.feature_layers)):  # the layers past the deepest feature layer never run
            x = self._layer(x, f"vision_tower.encoder.layers.{i}.")
            states.append(x)
        return mx.concatenate([states[i] for i in self.feature_layers], axis=-1)

    def _layer(self, x: mx.array, at: str) -> mx.array:
        x = x + self._attention(self._layer_norm(x, at + "layer_norm1."), at + "self_attn.")
        h = self._linear(self._layer_norm(x, at + "layer_norm2."), at + "mlp.fc1.")
        return x + self._linear(self.act(h), at + "mlp.fc2.")

    def _attention(self, x: mx.array, at: str) -> mx.array:
        n, t, d = x.shape
        q, k, v = (
            self._linear(x, f"{at}{name}.").reshape(n, t, self.heads, -1).transpose(0, 2, 1, 3)
            for name in ("q_proj", "k_proj", "v_proj")
        )
        # every patch sees every patch: no mask
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=(d // self.heads) ** -0.5)
        return self._linear(out.transpose(0, 2, 1, 3).reshape(n, t, d), at + "out_proj.")

    def _linear(self, x: mx.array, at: str) -> mx.array:
        bias = self.w.get(at + "bias")
        weight = self.w[at + "weight"].T
        return x @ weight if bias is None else mx.addmm(bias, x, weight)

    def _layer_norm(self, x: mx.array, at: str) -> mx.array:
        return mx.fast.layer_norm(x, self.w[at + "weight"], self.w[at + "bias"], self.eps)


def _our_name(key: str) -> str | None:
    for prefix, ours in _PREFIXES:
        if key.startswith(prefix):
            return ours + key[len(prefix) :]
    return None


def _checked(config: dict[str, Any], weights: dict[str, mx.array], source: Path) -> LlavaVision:
    wanted = _expected_names(config)
    kept = {name: value for name, value in weights.items() if name in wanted}
    mx.eval(list(kept.values()))  # evaluated now: nothing lazy stays bound to the loading thread's stream
    missing = wanted - kept.keys()
    if missing:  # a missing tensor is an error, not a random weight
        raise ValueError(f"{source}: the vision tower lacks {', '.join(sorted(missing)[:5])}")
    return LlavaVision(config, kept)


def load_llava_vision(folder: Path, dtype: mx.Dtype = mx.float32) -> LlavaVision:
    """The tower and projector of a LlavaForConditionalGeneration safetensors folder."""
    config = json.loads((folder / "config.json").read_text())
    weights: dict[str, mx.array] = {}
    for path in sorted(folder.glob("*.safetensors")):
        loaded = mx.load(str(path))
        assert isinstance(loaded, dict)
        for key, value in loaded.items():
            if (name := _our_name(key)) is not None:
                weights[name] = value.astype(dtype)
    return _checked(config, weights, folder)


def load_llava_mmproj(config: dict[str, Any], mmproj: Path, dtype: mx.Dtype = mx.float32) -> LlavaVision:
    """The same tower from llama.cpp's `mlp` mmproj (config: gguf_vision_config's dict for the pair)."""
    state = read_llava_mmproj(config, mmproj)
    return _checked(config, {name: mx.array(v).astype(dtype) for name, v in state.items()}, mmproj)


def _expected_names(config: dict[str, Any]) -> set[str]:
    emb = "vision_tower.embeddings."
    names = {emb + "class_embedding", emb + "patch_embedding.weight", emb + "position_embedding.weight"}
    names |= {f"vision_tower.pre_layrnorm.{s}" for s in ("weight", "bias")}
    bias = bool(config.get("multimodal_projector_bias", True))
    for linear in ("linear_1", "linear_2"):
        names |= {
            f"multi_modal_projector.{linear}.{s}" for s in (("weight", "bias") if bias else ("weight",))
        }
    attention = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj")
    parts = (*attention, "mlp.fc1", "mlp.fc2", "layer_norm1", "layer_norm2")
    for i in range(max(_feature_layers(config))):
        names |= {f"vision_tower.encoder.layers.{i}.{p}.{s}" for p in parts for s in ("weight", "bias")}
    return names
