"""LLaVA's image encoder: a CLIP ViT (patch conv without bias, a learned class token, learned positions,
a LayerNorm before the encoder, pre-norm layers with bidirectional attention and quick_gelu MLPs), whose
hidden states at `vision_feature_layer` (by default the penultimate layer's output; the final LayerNorm is
never used) lose the CLS row under the "default" strategy, then a 2-layer GELU MLP into the text model's
width. Module names follow the checkpoint's, so its tensors load without renaming."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import nn

from localchat.backends.torch.vision.gemma3 import _Attention

# Where the tower and the projector sit in a checkpoint, longest first: the hub files (transformers 4.5x
# and 5 on disk), then transformers 5's in-memory names.
_PREFIXES = (
    ("model.vision_tower.vision_model.", "vision_tower."),
    ("vision_tower.vision_model.", "vision_tower."),
    ("model.vision_tower.", "vision_tower."),
    ("vision_tower.", "vision_tower."),
    ("model.multi_modal_projector.", "multi_modal_projector."),
    ("multi_modal_projector.", "multi_modal_projector."),
)
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
}


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    if name not in ACTIVATIONS:
        raise ValueError(f"unsupported activation {name!r} (localchat runs {', '.join(ACTIVATIONS)})")
    return ACTIVATIONS[name]


class _MLP(nn.Module):
    def __init__(self, hidden: int, inner: int, act: str) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(hidden, inner), nn.Linear(inner, hidden)
        self.act = activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class _Layer(nn.Module):
    def __init__(self, hidden: int, inner: int, heads: int, eps: float, act: str) -> None:
        super().__init__()
        self.layer_norm1, self.layer_norm2 = nn.LayerNorm(hidden, eps=eps), nn.LayerNorm(hidden, eps=eps)
        self.self_attn, self.mlp = _Attention(hidden, heads), _MLP(hidden, inner, act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class _Embeddings(nn.Module):
    def __init__(self, hidden: int, patch: int, patches: int) -> None:
        super().__init__()
        self.class_embedding = nn.Parameter(torch.zeros(hidden))
        self.patch_embedding = nn.Conv2d(3, hidden, kernel_size=patch, stride=patch, bias=False)
        self.position_embedding = nn.Embedding(patches + 1, hidden)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        patches = self.patch_embedding(pixels).flatten(2).transpose(1, 2)  # [N, patches, hidden]
        cls = self.class_embedding.to(patches.dtype).expand(patches.shape[0], 1, -1)
        return torch.cat([cls, patches], dim=1) + self.position_embedding.weight


class _Encoder(nn.Module):
    def __init__(self, layers: list[_Layer]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)


class ClipTower(nn.Module):
    """pixels -> the hidden states at `feature_layers` (indices into [pre-normed embeddings, layer 1's
    output, ..., layer L's output], negative from the end), concatenated on the last axis."""

    def __init__(self, cfg: dict[str, Any], feature_layers: list[int]) -> None:
        super().__init__()
        hidden, eps = int(cfg["hidden_size"]), float(cfg.get("layer_norm_eps", 1e-5))
        grid = int(cfg["image_size"]) // int(cfg["patch_size"])
        self.embeddings = _Embeddings(hidden, int(cfg["patch_size"]), grid * grid)
        self.pre_layrnorm = nn.LayerNorm(hidden, eps=eps)  # (sic) the checkpoint's spelling
        depth = int(cfg["num_hidden_layers"])
        self.feature_layers = [i if i >= 0 else depth + 1 + i for i in feature_layers]
        if not all(0 <= i <= depth for i in self.feature_layers):
            raise ValueError(f"vision_feature_layer {feature_layers} is outside a {depth}-layer tower")
        layer = (hidden, int(cfg["intermediate_size"]), int(cfg["num_attention_heads"]), eps)
        act = str(cfg.get("hidden_act", "quick_gelu"))
        # the layers past the deepest feature layer never run, so they are not built or loaded
        self.encoder = _Encoder([_Layer(*layer, act) for _ in range(max(self.feature_layers))])

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.pre_layrnorm(self.embeddings(pixels))
        states = [x]
        for layer in self.encoder.layers:
            x = layer(x)
            states.append(x)
        return torch.cat([states[i] for i in self.feature_layers], dim=-1)


class LlavaProjector(nn.Module):
    def __init__(self, vision_hidden: int, text_hidden: int, act: str, bias: bool) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(vision_hidden, text_hidden, bias=bias)
        self.linear_2 = nn.Linear(text_hidden, text_hidden, bias=bias)
        self.act = activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(x)))


def feature_layers(config: dict[str, Any]) -> list[int]:
    layer = config.get("vision_feature_layer", -2)
    return [int(layer)] if isinstance(layer, int) else [int(i) for i in layer]


class LlavaVision(nn.Module):
    """pixel values [N, 3, S, S] -> image embeddings [N, patches (+ CLS under "full"), text hidden]."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        vision, text = config["vision_config"], config["text_config"]
        layers = feature_layers(config)
        self.vision_tower = ClipTower(vision, layers)
        self.drop_cls = config.get("vision_feature_select_strategy", "default") == "default"
        self.multi_modal_projector = LlavaProjector(
            int(vision["hidden_size"]) * len(layers),
            int(text["hidden_size"]),
            str(config.get("projector_hidden_act", "gelu")),
            bool(config.get("multimodal_projector_bias", True)),
        )

    @torch.inference_mode()
    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        features = self.vision_tower(pixels)
        return self.multi_modal_projector(features[:, 1:] if self.drop_cls else features)


def load_llava_vision(folder: Path, dtype: torch.dtype = torch.float32) -> LlavaVision:
    """The tower and projector of a LlavaForConditionalGeneration safetensors folder."""
    model = LlavaVision(json.loads((folder / "config.json").read_text()))
    wanted = set(model.state_dict())
    state: dict[str, torch.Tensor] = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118 (safe_open handles are not iterable)
                for prefix, ours in _PREFIXES:
                    if key.startswith(prefix):
                        name = ours + key[len(prefix) :]
                        # the final LayerNorm and the layers past the feature layer are never run
                        if name in wanted:
                            state[name] = handle.get_tensor(key)
                        break
    model.load_state_dict(state, strict=True)  # a missing tensor is an error, not a random weight
    return model.to(dtype).eval()
