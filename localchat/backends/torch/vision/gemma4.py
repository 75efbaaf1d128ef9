"""Gemma 4's image encoder and its embedder into the text model (transformers' Gemma4VisionModel +
Gemma4MultimodalEmbedder), for one picture of any shape:
- patches (row-major, 16 px) -> a linear projection of 2 * (pixels - 0.5), plus learned x and y position
  rows;
- pre/post-normed encoder layers (RMSNorm times its weight): q/k RMSNorm with a weight, v without, a 2-D
  rotary (the first half of each head turns with the patch's column, the second half with its row),
  unscaled bidirectional attention, a GeGLU MLP; linears optionally clamp their input and output
  (`use_clipped_linears`);
- the patch grid average-pooled kernel x kernel, times sqrt(hidden), optionally standardized;
- the embedder: RMSNorm without a weight, then a matrix into the text model's width.
Module names follow the checkpoint's, so its tensors load without renaming. Audio is not built."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import nn

# Where the tower and the embedder sit in a Gemma4ForConditionalGeneration checkpoint (transformers 5's
# on-disk names first, then the in-memory ones).
_PREFIXES = (
    ("model.vision_tower.", "vision_tower."),
    ("model.embed_vision.", "embed_vision."),
    ("vision_tower.", "vision_tower."),
    ("embed_vision.", "embed_vision."),
)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """transformers' Gemma4RMSNorm: float32, x * (mean(x^2) + eps) ** -0.5, times the weight itself."""
    out = x.float() * torch.pow(x.float().pow(2).mean(-1, keepdim=True) + eps, -0.5)
    return (out if weight is None else out * weight.float()).to(x.dtype)


class _Norm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(dim)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _rms_norm(x, self.weight, self.eps)


class _ClippableLinear(nn.Module):
    input_min: torch.Tensor
    input_max: torch.Tensor
    output_min: torch.Tensor
    output_max: torch.Tensor

    def __init__(self, inputs: int, outputs: int, clipped: bool) -> None:
        super().__init__()
        self.linear = nn.Linear(inputs, outputs, bias=False)
        self.clipped = clipped
        if clipped:  # the checkpoint's measured ranges (infinite when unset)
            for name in ("input_min", "input_max", "output_min", "output_max"):
                self.register_buffer(name, torch.tensor(math.inf if name.endswith("max") else -math.inf))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.clipped:
            return self.linear(x)
        x = self.linear(torch.clamp(x, self.input_min, self.input_max))
        return torch.clamp(x, self.output_min, self.output_max)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class _Attention(nn.Module):
    def __init__(self, cfg: dict[str, Any], clipped: bool) -> None:
        super().__init__()
        hidden, self.heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        self.kv_heads = int(cfg.get("num_key_value_heads", self.heads))
        self.head_dim = int(cfg.get("head_dim") or hidden // self.heads)
        self.eps = float(cfg.get("rms_norm_eps", 1e-6))
        d = self.head_dim
        self.q_proj = _ClippableLinear(hidden, self.heads * d, clipped)
        self.k_proj = _ClippableLinear(hidden, self.kv_heads * d, clipped)
        self.v_proj = _ClippableLinear(hidden, self.kv_heads * d, clipped)
        self.o_proj = _ClippableLinear(self.heads * d, hidden, clipped)
        self.q_norm, self.k_norm = _Norm(d, self.eps), _Norm(d, self.eps)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """x [T, hidden]; rope: cos, sin [T, head_dim / 2] for each of the two halves of a head."""
        t, d = x.shape[0], self.head_dim
        cos, sin = rope
        q = self._turn(self.q_norm(self.q_proj(x).view(t, self.heads, d)), cos, sin)
        k = self._turn(self.k_norm(self.k_proj(x).view(t, self.kv_heads, d)), cos, sin)
        v = _rms_norm(self.v_proj(x).view(t, self.kv_heads, d), None, self.eps)
        if self.kv_heads != self.heads:
            k, v = (z.repeat_interleave(self.heads // self.kv_heads, dim=1) for z in (k, v))
        # every patch sees every patch, scores unscaled
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), scale=1.0
        )
        return self.o_proj(out.transpose(0, 1).reshape(t, self.heads * d))

    @staticmethod
    def _turn(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        c, s = cos[:, None, :], sin[:, None, :]
        return torch.cat(
            (
                _rotate(x[..., :half], c[..., :half], s[..., :half]),
                _rotate(x[..., half:], c[..., half:], s[..., half:]),
            ),
            dim=-1,
        )


class _MLP(nn.Module):
    def __init__(self, hidden: int, inner: int, clipped: bool, activation: str) -> None:
        super().__init__()
        self.gate_proj = _ClippableLinear(hidden, inner, clipped)
        self.up_proj = _ClippableLinear(hidden, inner, clipped)
        self.down_proj = _ClippableLinear(inner, hidden, clipped)
        self.approximate = "tanh" if activation in ("gelu_pytorch_tanh", "gelu_new") else "none"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.gelu(self.gate_proj(x), approximate=self.approximate) * self.up_proj(x))


class _Layer(nn.Module):
    def __init__(self, cfg: dict[str, Any], clipped: bool) -> None:
        super().__init__()
        hidden, eps = int(cfg["hidden_size"]), float(cfg.get("rms_norm_eps", 1e-6))
        self.self_attn = _Attention(cfg, clipped)
        activation = str(cfg.get("hidden_activation", "gelu_pytorch_tanh"))
        self.mlp = _MLP(hidden, int(cfg["intermediate_size"]), clipped, activation)
        self.input_layernorm, self.post_attention_layernorm = _Norm(hidden, eps), _Norm(hidden, eps)
        self.pre_feedforward_layernorm, self.post_feedforward_layernorm = (
            _Norm(hidden, eps),
            _Norm(hidden, eps),
        )

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), rope))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class _Encoder(nn.Module):
    def __init__(self, layers: list[_Layer]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)


class _PatchEmbedder(nn.Module):
    def __init__(self, hidden: int, patch: int, positions: int) -> None:
        super().__init__()
        self.input_proj = nn.Linear(3 * patch * patch, hidden, bias=False)
        self.position_embedding_table = nn.Parameter(torch.zeros(2, positions, hidden))

    def forward(self, tiles: torch.Tensor, xy: torch.Tensor) -> torch.Tensor:
        x = self.input_proj((2 * (tiles - 0.5)).to(self.input_proj.weight.dtype))
        table = self.position_embedding_table
        return x + table[0][xy[:, 0]] + table[1][xy[:, 1]]


class Gemma4VisionTower(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        hidden = int(cfg["hidden_size"])
        clipped = bool(cfg.get("use_clipped_linears", False))
        self.patch = int(cfg.get("patch_size", 16))
        self.kernel = int(cfg.get("pooling_kernel_size", 3))
        self.hidden = hidden
        self.patch_embedder = _PatchEmbedder(
            hidden, self.patch, int(cfg.get("position_embedding_size", 10_240))
        )
        self.encoder = _Encoder([_Layer(cfg, clipped) for _ in range(int(cfg["num_hidden_layers"]))])
        self.standardize = bool(cfg.get("standardize", False))
        if self.standardize:
            self.register_buffer("std_bias", torch.zeros(hidden))
            self.register_buffer("std_scale", torch.ones(hidden))
        head_dim = int(cfg.get("head_dim") or hidden // int(cfg["num_attention_heads"]))
        theta = float((cfg.get("rope_parameters") or {}).get("rope_theta", 100.0))
        quarter = head_dim // 2  # each axis turns half a head: head_dim / 4 frequencies
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, quarter, 2, dtype=torch.float) / quarter))

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """pixels [3, H, W] in [0, 1] -> pooled features [H*W / (patch*kernel)^2, hidden] (float32 scale)."""
        _, h, w = pixels.shape
        rows, cols, p = h // self.patch, w // self.patch, self.patch
        tiles = pixels.reshape(3, rows, p, cols, p).permute(1, 3, 2, 4, 0).reshape(rows * cols, -1)
        ys, xs = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
        xy = torch.stack((xs.flatten(), ys.flatten()), dim=-1).to(pixels.device)
        x = self.patch_embedder(tiles, xy)
        freqs = xy[..., None].float() * self.inv_freq.to(pixels.device)  # [T, 2, head_dim / 4]
        angles = torch.cat((freqs[:, 0], freqs[:, 0], freqs[:, 1], freqs[:, 1]), dim=-1)
        rope = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        for layer in self.encoder.layers:
            x = layer(x, rope)
        k = self.kernel  # average each k x k block of patches, blocks in row-major order
        grid = x.float().T.reshape(1, -1, rows, cols)
        pooled = F.avg_pool2d(grid, k).flatten(2)[0].T if k > 1 else grid.flatten(2)[0].T
        pooled = pooled * self.hidden**0.5
        if self.standardize:
            pooled = (pooled - self.std_bias.float()) * self.std_scale.float()
        return pooled.to(x.dtype)


class _Embedder(nn.Module):
    def __init__(self, vision_hidden: int, text_hidden: int, eps: float) -> None:
        super().__init__()
        self.embedding_projection = nn.Linear(vision_hidden, text_hidden, bias=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.embedding_projection(_rms_norm(x, None, self.eps))


class Gemma4Vision(nn.Module):
    """pixel values [N, 3, H, W] (pictures of one size) -> image embeddings [N, soft tokens, text hidden]."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        vision, text = config["vision_config"], config["text_config"]
        self.vision_tower = Gemma4VisionTower(vision)
        self.embed_vision = _Embedder(
            int(vision.get("output_proj_dims") or vision["hidden_size"]),
            int(text["hidden_size"]),
            float(vision.get("rms_norm_eps", 1e-6)),
        )
        self.image_token_id = int(config.get("image_token_id", 258_880))

    @torch.inference_mode()
    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        return torch.stack([self.embed_vision(self.vision_tower(picture)) for picture in pixels])


def has_gemma4_vision(folder: Path) -> bool:
    """Whether the folder's safetensors hold the vision tower (a text-only export names it but has none)."""
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            if any(key.startswith(("model.vision_tower.", "vision_tower.")) for key in handle.keys()):  # noqa: SIM118
                return True
    return False


def load_gemma4_vision(folder: Path, dtype: torch.dtype = torch.float32) -> Gemma4Vision:
    """The tower and embedder of a Gemma4ForConditionalGeneration safetensors folder."""
    model = Gemma4Vision(json.loads((folder / "config.json").read_text()))
    state: dict[str, torch.Tensor] = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118 (safe_open handles are not iterable)
                for prefix, ours in _PREFIXES:
                    if key.startswith(prefix):
                        state[ours + key[len(prefix) :]] = handle.get_tensor(key)
                        break
    model.load_state_dict(state, strict=True)  # a missing tensor is an error, not a random weight
    return model.to(dtype).eval()
