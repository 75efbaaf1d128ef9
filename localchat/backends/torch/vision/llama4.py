"""Llama 4's image encoder (Llama4VisionModel) and projector, per tile: the patches cut by unfold and
mapped by one matrix, a class token appended last, learned positions, LayerNorm, encoder layers with 2-D
rotary attention (x then y frequencies over complex pairs; the class token does not turn), LayerNorm, the
class token dropped, the pixel shuffle (each 2 x 2 block of patches into one row) and a two-matrix GELU
MLP, then the projector's matrix into the text model's width. Module names follow the checkpoint's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import nn

from localchat.errors import ModelLoadError

LN_EPS = 1e-5  # transformers builds these LayerNorms with torch's default eps, whatever norm_eps says


def _theta(vision: dict[str, Any]) -> float:
    rope = vision.get("rope_parameters") or {}
    return float(rope.get("rope_theta", vision.get("rope_theta", 10000.0)))


def rotary(vision: dict[str, Any]) -> torch.Tensor:
    """Complex rotations [patches + 1, head_dim / 2]: x frequencies then y, position + 1; the class token
    (last) none."""
    grid = int(vision["image_size"]) // int(vision["patch_size"])
    head_dim = int(vision["hidden_size"]) // int(vision["num_attention_heads"])
    half = head_dim // 2
    freq = 1.0 / (_theta(vision) ** (torch.arange(0, half, 2)[: half // 2].float() / half))
    index = torch.arange(grid * grid)
    x = ((index % grid + 1)[:, None] * freq).repeat_interleave(2, dim=-1)
    y = ((index // grid + 1)[:, None] * freq).repeat_interleave(2, dim=-1)
    angles = torch.cat([x, y], dim=-1)[:, ::2]
    angles = torch.cat([angles, torch.zeros(1, angles.shape[1])])
    return torch.polar(torch.ones_like(angles), angles)


def _turn(x: torch.Tensor, rot: torch.Tensor) -> torch.Tensor:
    """x [tiles, T, heads, head_dim] turned pairwise (adjacent dims) by rot [T, head_dim / 2]."""
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(pairs * rot[None, :, None, :]).flatten(3).type_as(x)


class _Attention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q_proj, self.k_proj = nn.Linear(width, width), nn.Linear(width, width)
        self.v_proj, self.o_proj = nn.Linear(width, width), nn.Linear(width, width)

    def forward(self, x: torch.Tensor, rot: torch.Tensor) -> torch.Tensor:
        n, t, d = x.shape
        shape = (n, t, self.heads, d // self.heads)
        q = _turn(self.q_proj(x).view(shape), rot).transpose(1, 2)
        k = _turn(self.k_proj(x).view(shape), rot).transpose(1, 2)
        v = self.v_proj(x).view(shape).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v)  # bidirectional within the tile
        return self.o_proj(out.transpose(1, 2).reshape(n, t, d))


class _Mlp(nn.Module):
    def __init__(self, width: int, inner: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(width, inner), nn.Linear(inner, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class _Layer(nn.Module):
    def __init__(self, width: int, heads: int, inner: int) -> None:
        super().__init__()
        self.self_attn = _Attention(width, heads)
        self.mlp = _Mlp(width, inner)
        self.input_layernorm = nn.LayerNorm(width, eps=LN_EPS)
        self.post_attention_layernorm = nn.LayerNorm(width, eps=LN_EPS)

    def forward(self, x: torch.Tensor, rot: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rot)
        return x + self.mlp(self.post_attention_layernorm(x))


class _Encoder(nn.Module):
    def __init__(self, vision: dict[str, Any]) -> None:
        super().__init__()
        width, heads = int(vision["hidden_size"]), int(vision["num_attention_heads"])
        self.layers = nn.ModuleList(
            _Layer(width, heads, int(vision["intermediate_size"]))
            for _ in range(int(vision["num_hidden_layers"]))
        )


class _Unfold(nn.Module):
    def __init__(self, patch: int, width: int) -> None:
        super().__init__()
        self.patch = patch
        self.linear = nn.Linear(3 * patch * patch, width, bias=False)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        patches = F.unfold(pixels, kernel_size=self.patch, stride=self.patch)  # [n, 3 * p * p, patches]
        return self.linear(patches.transpose(1, 2))


class _AdapterMlp(nn.Module):
    def __init__(self, inner: int, projector_in: int, projector_out: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(inner, projector_in, bias=False)
        self.fc2 = nn.Linear(projector_out, projector_out, bias=False)


class _Adapter(nn.Module):
    def __init__(self, vision: dict[str, Any]) -> None:
        super().__init__()
        self.ratio = float(vision.get("pixel_shuffle_ratio", 0.5))
        self.mlp = _AdapterMlp(
            int(vision["intermediate_size"]),
            int(vision["projector_input_dim"]),
            int(vision["projector_output_dim"]),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[n, grid², d] -> pixel shuffle (transformers' order of views and swaps) -> GELU MLP."""
        n, count, d = x.shape
        grid, r = round(count**0.5), self.ratio
        x = x.view(n, grid, int(grid * r), int(d / r)).permute(0, 2, 1, 3).contiguous()
        x = x.view(n, int(grid * r), int(grid * r), int(d / (r * r))).permute(0, 2, 1, 3).contiguous()
        x = x.view(n, -1, x.shape[-1])
        return F.gelu(self.mlp.fc2(F.gelu(self.mlp.fc1(x))))


class Llama4VisionTower(nn.Module):
    def __init__(self, vision: dict[str, Any]) -> None:
        super().__init__()
        width = int(vision["hidden_size"])
        grid = int(vision["image_size"]) // int(vision["patch_size"])
        self.patch_embedding = _Unfold(int(vision["patch_size"]), width)
        self.class_embedding = nn.Parameter(torch.zeros(width))
        self.positional_embedding_vlm = nn.Parameter(torch.zeros(grid * grid + 1, width))
        self.layernorm_pre = nn.LayerNorm(width, eps=LN_EPS)
        self.layernorm_post = nn.LayerNorm(width, eps=LN_EPS)
        self.model = _Encoder(vision)
        self.vision_adapter = _Adapter(vision)
        self.rot = rotary(vision)  # complex64, not a buffer: Module.to(dtype) would drop its imaginary part

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """[tiles, 3, S, S] -> [tiles, tokens per tile, projector_output_dim]."""
        x = self.patch_embedding(pixels)
        x = torch.cat([x, self.class_embedding.expand(x.shape[0], 1, -1)], dim=1)
        x = self.layernorm_pre(x + self.positional_embedding_vlm)
        rot = self.rot.to(x.device)
        for layer in self.model.layers:
            x = layer(x, rot)
        return self.vision_adapter(self.layernorm_post(x)[:, :-1])


class _Projector(nn.Module):
    def __init__(self, vision_out: int, text_hidden: int) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(vision_out, text_hidden, bias=False)


class Llama4Vision(nn.Module):
    """pixel values [batch, tiles, 3, S, S] -> image rows [batch, tiles * tokens per tile, text hidden]."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        vision = config["vision_config"]
        act = vision.get("hidden_act", "gelu")
        if act != "gelu":
            raise ModelLoadError(f"Llama 4 vision tower with hidden_act {act!r} is not supported")
        self.vision_model = Llama4VisionTower(vision)
        self.multi_modal_projector = _Projector(
            int(vision.get("vision_output_dim", 7680)), int(config["text_config"]["hidden_size"])
        )

    @torch.inference_mode()
    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        batch = pixels.shape[0]
        rows = self.multi_modal_projector.linear_1(self.vision_model(pixels.flatten(0, 1)))
        return rows.reshape(batch, -1, rows.shape[-1])


def load_llama4_vision(folder: Path, dtype: torch.dtype = torch.float32) -> Llama4Vision | None:
    """The tower and projector of a Llama4ForConditionalGeneration safetensors folder; None when its files
    hold no vision tensor at all (a text-only export that keeps the multimodal config)."""
    model = Llama4Vision(json.loads((folder / "config.json").read_text()))
    state: dict[str, torch.Tensor] = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118 (safe_open handles are not iterable)
                if key.startswith(("vision_model.", "multi_modal_projector.")):
                    state[key] = handle.get_tensor(key)
    if not state:
        return None
    try:
        model.load_state_dict(state, strict=True)  # a missing tensor is an error, not a random weight
    except RuntimeError as exc:
        raise ModelLoadError(f"{folder.name} does not hold a Llama 4 vision tower: {exc}") from exc
    return model.to(dtype).eval()
