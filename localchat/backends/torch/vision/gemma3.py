"""Gemma 3's image encoder: a SigLIP ViT (patch conv, learned positions, pre-norm encoder layers with
bidirectional attention, gelu-tanh MLP, final LayerNorm), then the multi-modal projector (average pool of
the patch grid down to mm_tokens_per_image, Gemma RMSNorm with (1 + weight), a matrix into the text
model's width). Module names follow the checkpoint's, so its tensors load without renaming."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import nn

# Where the tower and the projector sit in a checkpoint, longest first: the hub files (transformers 4.5x),
# then transformers 5's on-disk and in-memory names.
_PREFIXES = (
    ("model.vision_tower.vision_model.", "vision_tower."),
    ("vision_tower.vision_model.", "vision_tower."),
    ("model.vision_tower.", "vision_tower."),
    ("vision_tower.", "vision_tower."),
    ("model.multi_modal_projector.", "multi_modal_projector."),
    ("multi_modal_projector.", "multi_modal_projector."),
)


class _Attention(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(hidden, hidden) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, d = x.shape
        q, k, v = (
            p(x).view(n, t, self.heads, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        out = F.scaled_dot_product_attention(q, k, v)  # every patch sees every patch
        return self.out_proj(out.transpose(1, 2).reshape(n, t, d))


class _MLP(nn.Module):
    def __init__(self, hidden: int, inner: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(hidden, inner), nn.Linear(inner, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class _Layer(nn.Module):
    def __init__(self, hidden: int, inner: int, heads: int, eps: float) -> None:
        super().__init__()
        self.layer_norm1, self.layer_norm2 = nn.LayerNorm(hidden, eps=eps), nn.LayerNorm(hidden, eps=eps)
        self.self_attn, self.mlp = _Attention(hidden, heads), _MLP(hidden, inner)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class _Embeddings(nn.Module):
    def __init__(self, hidden: int, patch: int, patches: int) -> None:
        super().__init__()
        self.patch_embedding = nn.Conv2d(3, hidden, kernel_size=patch, stride=patch)
        self.position_embedding = nn.Embedding(patches, hidden)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.patch_embedding(pixels).flatten(2).transpose(1, 2)  # [N, patches, hidden]
        return x + self.position_embedding.weight


class _Encoder(nn.Module):
    def __init__(self, layers: list[_Layer]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)


class SiglipTower(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        hidden, eps = int(cfg["hidden_size"]), float(cfg.get("layer_norm_eps", 1e-6))
        self.grid = int(cfg["image_size"]) // int(cfg["patch_size"])
        self.embeddings = _Embeddings(hidden, int(cfg["patch_size"]), self.grid * self.grid)
        layer_args = (hidden, int(cfg["intermediate_size"]), int(cfg["num_attention_heads"]), eps)
        self.encoder = _Encoder([_Layer(*layer_args) for _ in range(int(cfg["num_hidden_layers"]))])
        self.post_layernorm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.embeddings(pixels)
        for layer in self.encoder.layers:
            x = layer(x)
        return self.post_layernorm(x)


class _GemmaNorm(nn.Module):
    """Holds the projector's RMSNorm weight (applied as 1 + weight, in float32, in Projector.forward)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))


class Projector(nn.Module):
    def __init__(self, vision_hidden: int, text_hidden: int, grid: int, tokens: int, eps: float) -> None:
        super().__init__()
        self.mm_input_projection_weight = nn.Parameter(torch.zeros(vision_hidden, text_hidden))
        self.mm_soft_emb_norm = _GemmaNorm(vision_hidden)
        self.grid, self.eps = grid, eps
        self.kernel = grid // round(tokens**0.5)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        n, _, d = patches.shape
        grid = patches.transpose(1, 2).reshape(n, d, self.grid, self.grid)
        pooled = F.avg_pool2d(grid, self.kernel).flatten(2).transpose(1, 2).float()
        normed = pooled * torch.rsqrt(pooled.pow(2).mean(-1, keepdim=True) + self.eps)
        normed = (normed * (1.0 + self.mm_soft_emb_norm.weight.float())).to(patches.dtype)
        return normed @ self.mm_input_projection_weight


class Gemma3Vision(nn.Module):
    """pixel values [N, 3, S, S] -> image embeddings [N, mm_tokens_per_image, text hidden]."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        vision, text = config["vision_config"], config["text_config"]
        self.vision_tower = SiglipTower(vision)
        self.tokens_per_image = int(config.get("mm_tokens_per_image", 256))
        self.image_size = int(vision["image_size"])
        self.image_token_id = int(config.get("image_token_index", config.get("image_token_id", 262_144)))
        eps = float(vision.get("layer_norm_eps", 1e-6))
        self.multi_modal_projector = Projector(
            int(vision["hidden_size"]),
            int(text["hidden_size"]),
            self.vision_tower.grid,
            self.tokens_per_image,
            eps,
        )

    @torch.inference_mode()
    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.multi_modal_projector(self.vision_tower(pixels))


def load_gemma3_vision(folder: Path, dtype: torch.dtype = torch.float32) -> Gemma3Vision:
    """The tower and projector of a Gemma3ForConditionalGeneration safetensors folder."""
    model = Gemma3Vision(json.loads((folder / "config.json").read_text()))
    state: dict[str, torch.Tensor] = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118 (safe_open handles are not iterable)
                for prefix, ours in _PREFIXES:
                    rest = key[len(prefix) :]
                    # SigLIP's pooling head is not used: Gemma 3 reads every patch
                    if key.startswith(prefix) and not rest.startswith("head."):
                        state[ours + rest] = handle.get_tensor(key)
                    if key.startswith(prefix):
                        break
    model.load_state_dict(state, strict=True)  # a missing tensor is an error, not a random weight
    return model.to(dtype).eval()
