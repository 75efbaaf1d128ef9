"""Mistral Small 3.x's image encoder: the Pixtral ViT (a patch conv without bias, an RMSNorm before the
encoder, pre-RMSNorm layers with bidirectional attention, 2-D rotary positions over (row, column) and
SwiGLU-style MLPs) over a picture at its own size, then Mistral 3's projector: an RMSNorm, the patch
merger (each spatial_merge x spatial_merge block of patches concatenated, channel-major as torch's unfold
lays it out, then one linear), and a linear-act-linear into the text model's width. Module names follow
the checkpoint's, so its tensors load without renaming."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import nn

from localchat.backends.torch.vision.llava import ACTIVATIONS
from localchat.errors import ModelLoadError
from localchat.vision.pixtral_mmproj import read_pixtral_mmproj

# Where the tower and the projector sit in a checkpoint: the hub files (transformers 4.5x), then
# transformers 5's names on disk.
_PREFIXES = (
    ("model.vision_tower.", "vision_tower."),
    ("vision_tower.", "vision_tower."),
    ("model.multi_modal_projector.", "multi_modal_projector."),
    ("multi_modal_projector.", "multi_modal_projector."),
)


def _activation(name: str) -> Any:
    table = {**ACTIVATIONS, "silu": F.silu}
    if name not in table:
        raise ValueError(f"unsupported activation {name!r} (localchat runs {', '.join(table)})")
    return table[name]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


def rope_theta(vision: dict[str, Any]) -> float:
    """transformers 5 nests it in rope_parameters; the hub's config.json has it at the top level."""
    params = vision.get("rope_parameters") or {}
    return float(params.get("rope_theta", vision.get("rope_theta", 10_000.0)))


def axial_angles(rows: int, columns: int, head_dim: int, theta: float) -> torch.Tensor:
    """Rotary angles [rows * columns, head_dim] for patches in row-major order: the even frequencies
    turn with the row, the odd ones with the column, and the half is repeated for rotate-half."""
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
    row = torch.arange(rows, dtype=torch.float)[:, None] * freqs[0::2]  # [rows, head_dim / 4]
    col = torch.arange(columns, dtype=torch.float)[:, None] * freqs[1::2]
    half = torch.cat(
        [row[:, None, :].expand(rows, columns, -1), col[None, :, :].expand(rows, columns, -1)], dim=-1
    ).reshape(rows * columns, head_dim // 2)
    return torch.cat([half, half], dim=-1)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


class _Attention(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.q_proj = nn.Linear(hidden, hidden, bias=False)
        self.k_proj = nn.Linear(hidden, hidden, bias=False)
        self.v_proj = nn.Linear(hidden, hidden, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        n, length, _ = x.shape
        q, k, v = (
            proj(x).view(n, length, self.heads, self.head_dim).transpose(1, 2)
            for proj in (self.q_proj, self.k_proj, self.v_proj)
        )
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        out = F.scaled_dot_product_attention(q, k, v)  # one picture per row: no mask
        return self.o_proj(out.transpose(1, 2).reshape(n, length, -1))


class _FeedForward(nn.Module):
    def __init__(self, hidden: int, inner: int, act: str) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)
        self.act = _activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class _Layer(nn.Module):
    def __init__(self, hidden: int, inner: int, heads: int, act: str) -> None:
        super().__init__()
        self.attention_norm, self.ffn_norm = RMSNorm(hidden, 1e-5), RMSNorm(hidden, 1e-5)
        self.attention, self.feed_forward = _Attention(hidden, heads), _FeedForward(hidden, inner, act)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class _Transformer(nn.Module):
    def __init__(self, layers: list[_Layer]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)


class PixtralTower(nn.Module):
    """pixels [N, 3, H, W] (sides multiples of the patch) -> the hidden states at `feature_layers`
    (indices into [normed patch embeddings, layer 1's output, ..., layer L's output], negative from the
    end), concatenated on the last axis: [N, (H / patch) * (W / patch), hidden * len(feature_layers)]."""

    def __init__(self, cfg: dict[str, Any], feature_layers: list[int]) -> None:
        super().__init__()
        hidden, self.patch = int(cfg["hidden_size"]), int(cfg["patch_size"])
        self.heads, self.theta = int(cfg["num_attention_heads"]), rope_theta(cfg)
        self.patch_conv = nn.Conv2d(3, hidden, kernel_size=self.patch, stride=self.patch, bias=False)
        self.ln_pre = RMSNorm(hidden, 1e-5)
        depth = int(cfg["num_hidden_layers"])
        self.feature_layers = [i if i >= 0 else depth + 1 + i for i in feature_layers]
        if not all(0 <= i <= depth for i in self.feature_layers):
            raise ValueError(f"vision_feature_layer {feature_layers} is outside a {depth}-layer tower")
        act = str(cfg.get("hidden_act", "gelu"))
        layer = (hidden, int(cfg["intermediate_size"]), self.heads, act)
        # the layers past the deepest feature layer never run, so they are not built or loaded
        self.transformer = _Transformer([_Layer(*layer) for _ in range(max(self.feature_layers))])

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        patches = self.patch_conv(pixels)  # [N, hidden, rows, columns]
        rows, columns = patches.shape[-2:]
        x = self.ln_pre(patches.flatten(2).transpose(1, 2))
        angles = axial_angles(rows, columns, x.shape[-1] // self.heads, self.theta).to(x.device)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        states = [x]
        for layer in self.transformer.layers:
            x = layer(x, cos, sin)
            states.append(x)
        return torch.cat([states[i] for i in self.feature_layers], dim=-1)


class _PatchMerger(nn.Module):
    def __init__(self, hidden: int, merge: int) -> None:
        super().__init__()
        self.merge = merge
        self.merging_layer = nn.Linear(hidden * merge * merge, hidden, bias=False)

    def forward(self, x: torch.Tensor, rows: int, columns: int) -> torch.Tensor:
        """[N, rows * columns, d] -> [N, (rows / m) * (columns / m), d], merged blocks in row-major order."""
        n, _, d = x.shape
        m = self.merge
        blocks = x.view(n, rows // m, m, columns // m, m, d).permute(0, 1, 3, 5, 2, 4)
        return self.merging_layer(blocks.reshape(n, (rows // m) * (columns // m), d * m * m))


class Mistral3Projector(nn.Module):
    def __init__(self, config: dict[str, Any], vision_hidden: int, layers: int) -> None:
        super().__init__()
        text = config["text_config"]
        text_hidden, bias = int(text["hidden_size"]), bool(config.get("multimodal_projector_bias", False))
        self.norm = RMSNorm(vision_hidden, float(text.get("rms_norm_eps", 1e-5)))
        self.patch_merger = _PatchMerger(vision_hidden, int(config.get("spatial_merge_size", 2)))
        self.linear_1 = nn.Linear(vision_hidden * layers, text_hidden, bias=bias)
        self.linear_2 = nn.Linear(text_hidden, text_hidden, bias=bias)
        self.act = _activation(str(config.get("projector_hidden_act", "gelu")))

    def forward(self, x: torch.Tensor, rows: int, columns: int) -> torch.Tensor:
        merged = self.patch_merger(self.norm(x), rows, columns)
        return self.linear_2(self.act(self.linear_1(merged)))


def feature_layers(config: dict[str, Any]) -> list[int]:
    """One layer: the projector's norm and patch merger are as wide as the tower, so a list of layers
    (concatenated) has no projector to go through, in transformers either."""
    layer = config.get("vision_feature_layer", -1)
    if not isinstance(layer, int):
        raise ValueError(f"vision_feature_layer {layer!r}: Mistral 3's projector takes one layer")
    return [layer]


class PixtralVision(nn.Module):
    """pixel values [N, 3, H, W] of same-sized pictures (sides multiples of patch x merge) -> image
    embeddings [N, (H / unit) * (W / unit), text hidden], row-major like the prompt's `[IMG]` tokens."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        vision, layers = config["vision_config"], feature_layers(config)
        self.vision_tower = PixtralTower(vision, layers)
        self.multi_modal_projector = Mistral3Projector(config, int(vision["hidden_size"]), len(layers))

    @torch.inference_mode()
    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        features = self.vision_tower(pixels)
        patch = self.vision_tower.patch
        return self.multi_modal_projector(features, pixels.shape[-2] // patch, pixels.shape[-1] // patch)


def load_pixtral_vision(folder: Path, dtype: torch.dtype = torch.float32) -> PixtralVision:
    """The tower and projector of a Mistral3ForConditionalGeneration safetensors folder."""
    model = PixtralVision(json.loads((folder / "config.json").read_text()))
    wanted = set(model.state_dict())
    state: dict[str, torch.Tensor] = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118 (safe_open handles are not iterable)
                for prefix, ours in _PREFIXES:
                    if key.startswith(prefix):
                        name = ours + key[len(prefix) :]
                        if name in wanted:  # the layers past the feature layer are never run
                            state[name] = handle.get_tensor(key)
                        break
    model.load_state_dict(state, strict=True)  # a missing tensor is an error, not a random weight
    return model.to(dtype).eval()


def load_pixtral_mmproj(
    config: dict[str, Any], mmproj: Path, dtype: torch.dtype = torch.float32
) -> PixtralVision:
    """The same tower from llama.cpp's `pixtral` mmproj (config: mmproj.py's gguf_vision_config dict)."""
    model = PixtralVision(config)
    state = {name: torch.from_numpy(values) for name, values in read_pixtral_mmproj(config, mmproj).items()}
    try:
        model.load_state_dict(state, strict=True)  # a missing tensor is an error, not a random weight
    except RuntimeError as exc:
        raise ModelLoadError(f"{mmproj.name} does not hold a Pixtral tower: {exc}") from exc
    return model.to(dtype).eval()
