"""The Qwen2.5-VL and Qwen3-VL vision towers: a ViT over flattened patches (the Conv3d patch embedding as one
matmul, since stride == kernel), 2-D rotary positions over each patch's (row, column), bidirectional
attention within one image (Qwen2.5-VL: within windows of window_size pixels, except the
fullatt_block_indexes layers), then the patch merger (each 2x2 group of neighbouring patches concatenated,
an MLP into the text model's width).

Qwen2.5-VL: RMSNorm, SwiGLU MLP, no learned positions. Qwen3-VL: LayerNorm, gelu-tanh MLP, a learned
position table bilinearly resized to the image's grid, and DeepStack: the outputs of some middle layers,
each merged by its own merger, are added to the text model's hidden states after its first layers. Those
come back concatenated after the main rows: [tokens, hidden * (1 + len(deepstack))].

Patches arrive in merge-group order (the processor's layout), so a group's 4 patches are consecutive."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import nn

# Where the tower sits in a checkpoint: the hub files and transformers 4.5x, then transformers 5.
_PREFIXES = ("model.visual.", "visual.")


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class _Attention(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, bounds: list[int]
    ) -> torch.Tensor:
        """x [T, hidden]; attention only within each [bounds[i], bounds[i+1]) span (a window or the image)."""
        t = x.shape[0]
        q, k, v = self.qkv(x).view(t, 3, self.heads, -1).unbind(1)  # each [T, heads, d]
        q = (q.float() * cos + _rotate_half(q.float()) * sin).to(x.dtype)
        k = (k.float() * cos + _rotate_half(k.float()) * sin).to(x.dtype)
        q, k, v = (a.transpose(0, 1) for a in (q, k, v))  # [heads, T, d]
        if len(bounds) == 2:
            out = F.scaled_dot_product_attention(q, k, v)
        else:
            out = torch.cat(
                [
                    F.scaled_dot_product_attention(q[:, a:b], k[:, a:b], v[:, a:b])
                    for a, b in itertools.pairwise(bounds)
                ],
                dim=1,
            )
        return self.proj(out.transpose(0, 1).reshape(t, -1))


class _RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class _SwiGLU(nn.Module):  # Qwen2.5-VL's block MLP (with biases)
    def __init__(self, hidden: int, inner: int) -> None:
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(hidden, inner), nn.Linear(hidden, inner)
        self.down_proj = nn.Linear(inner, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _GeluMLP(nn.Module):  # Qwen3-VL's block MLP
    def __init__(self, hidden: int, inner: int) -> None:
        super().__init__()
        self.linear_fc1, self.linear_fc2 = nn.Linear(hidden, inner), nn.Linear(inner, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.gelu(self.linear_fc1(x), approximate="tanh"))


class _QuickGeluMLP(nn.Module):  # Qwen2-VL's block MLP
    def __init__(self, hidden: int, inner: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(hidden, inner), nn.Linear(inner, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        return self.fc2(h * torch.sigmoid(1.702 * h))


class _Block(nn.Module):
    def __init__(self, hidden: int, inner: int, heads: int, qwen3: bool, qwen2: bool = False) -> None:
        super().__init__()
        self.norm1: nn.Module
        self.norm2: nn.Module
        self.mlp: nn.Module
        if qwen2:
            self.norm1, self.norm2 = nn.LayerNorm(hidden, eps=1e-6), nn.LayerNorm(hidden, eps=1e-6)
            self.mlp = _QuickGeluMLP(hidden, inner)
        elif qwen3:
            self.norm1, self.norm2 = nn.LayerNorm(hidden, eps=1e-6), nn.LayerNorm(hidden, eps=1e-6)
            self.mlp = _GeluMLP(hidden, inner)
        else:
            self.norm1, self.norm2 = _RMSNorm(hidden), _RMSNorm(hidden)
            self.mlp = _SwiGLU(hidden, inner)
        self.attn = _Attention(hidden, heads)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, bounds: list[int]
    ) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, bounds)
        return x + self.mlp(self.norm2(x))


class _Merger25(nn.Module):
    """Qwen2.5-VL: RMSNorm per patch (Qwen2-VL: LayerNorm), then each group of merge^2 patches concatenated
    through an MLP."""

    def __init__(self, hidden: int, out: int, merge: int, layer_norm: bool = False) -> None:
        super().__init__()
        self.grouped = hidden * merge * merge
        self.ln_q: nn.Module = nn.LayerNorm(hidden, eps=1e-6) if layer_norm else _RMSNorm(hidden)
        self.mlp = nn.Sequential(
            nn.Linear(self.grouped, self.grouped), nn.GELU(), nn.Linear(self.grouped, out)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.ln_q(x).view(-1, self.grouped))


class _Merger3(nn.Module):
    """Qwen3-VL: LayerNorm per patch (the main merger) or per concatenated group (DeepStack's), then an MLP."""

    def __init__(self, hidden: int, out: int, merge: int, post_shuffle_norm: bool) -> None:
        super().__init__()
        self.grouped = hidden * merge * merge
        self.post_shuffle_norm = post_shuffle_norm
        self.norm = nn.LayerNorm(self.grouped if post_shuffle_norm else hidden, eps=1e-6)
        self.linear_fc1 = nn.Linear(self.grouped, self.grouped)
        self.linear_fc2 = nn.Linear(self.grouped, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = (
            self.norm(x.view(-1, self.grouped))
            if self.post_shuffle_norm
            else self.norm(x).view(-1, self.grouped)
        )
        return self.linear_fc2(F.gelu(self.linear_fc1(x)))


class QwenVisionTower(nn.Module):
    def __init__(self, vision: dict[str, Any], qwen3: bool, qwen2: bool = False) -> None:
        """qwen2: Qwen2-VL's tower (LayerNorm, quick-gelu MLP, no windows); its config names the width
        embed_dim and the text model's width hidden_size."""
        super().__init__()
        hidden = int(vision["embed_dim"] if qwen2 else vision["hidden_size"])
        heads = int(vision["num_heads"])
        self.qwen3 = qwen3
        self.patch = int(vision.get("patch_size", 16 if qwen3 else 14))
        self.temporal = int(vision.get("temporal_patch_size", 2))
        self.merge = int(vision.get("spatial_merge_size", 2))
        self.in_channels = int(vision.get("in_channels", 3))
        self.window = int(vision.get("window_size", 0))
        self.full_layers = frozenset(int(i) for i in vision.get("fullatt_block_indexes", ()))
        self.deepstack = [int(i) for i in vision.get("deepstack_visual_indexes", ())] if qwen3 else []
        out = int(vision["hidden_size"] if qwen2 else vision["out_hidden_size"])
        depth = int(vision["depth"])
        inner = hidden * int(vision.get("mlp_ratio", 4)) if qwen2 else int(vision["intermediate_size"])
        head_dim = hidden // heads
        theta = float((vision.get("rope_parameters") or {}).get("rope_theta", 10000.0))
        spatial = head_dim // 2  # half the rotated dims turn with the row, half with the column
        inv_freq = 1.0 / (theta ** (torch.arange(0, spatial, 2, dtype=torch.float) / spatial))
        self.inv_freq: torch.Tensor
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        patch_dim = self.in_channels * self.temporal * self.patch * self.patch
        self.patch_embed = nn.Linear(patch_dim, hidden, bias=qwen3)  # the Conv3d, flattened
        self.blocks = nn.ModuleList(_Block(hidden, inner, heads, qwen3, qwen2) for _ in range(depth))
        self.merger: nn.Module
        if qwen3:
            self.pos_embed = nn.Embedding(int(vision["num_position_embeddings"]), hidden)
            self.side = int(int(vision["num_position_embeddings"]) ** 0.5)
            self.merger = _Merger3(hidden, out, self.merge, post_shuffle_norm=False)
            self.deepstack_merger_list = nn.ModuleList(
                _Merger3(hidden, out, self.merge, post_shuffle_norm=True) for _ in self.deepstack
            )
        else:
            self.merger = _Merger25(hidden, out, self.merge, layer_norm=qwen2)

    @property
    def stacked(self) -> int:
        """Embedding blocks per token: the main one plus one per DeepStack layer."""
        return 1 + len(self.deepstack)

    def encode(self, patches: torch.Tensor, grid: tuple[int, int, int]) -> torch.Tensor:
        """One image: patches [t*h*w, C*T*P*P] in merge-group order, grid (t, h, w) in patches ->
        [t*h*w / merge^2, out_hidden * stacked]."""
        t, h, w = grid
        x = self.patch_embed(patches.to(self.patch_embed.weight.dtype))
        rows, cols = (p.to(x.device) for p in self._positions(t, h, w))
        if self.qwen3:
            x = x + self._learned_positions(h, w).repeat(t, 1).to(x.dtype)
        order: torch.Tensor | None = None
        window_bounds = image_bounds = [0, x.shape[0]]
        if not self.qwen3 and self.window:
            order, window_bounds = self._windows(t, h, w)
            order = order.to(x.device)
            x = self._by_group(x, order)
            rows, cols = (
                self._by_group(rows[:, None], order)[:, 0],
                self._by_group(cols[:, None], order)[:, 0],
            )
        inv_freq = self.inv_freq.float()
        freqs = torch.cat((rows[:, None] * inv_freq, cols[:, None] * inv_freq), dim=-1)
        emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]  # [T, 1, head_dim]
        cos, sin = emb.cos(), emb.sin()
        stacked: list[torch.Tensor] = []
        for index, block in enumerate(self.blocks):
            full = self.qwen3 or index in self.full_layers
            x = block(x, cos, sin, image_bounds if full else window_bounds)
            if index in self.deepstack:
                stacked.append(self.deepstack_merger_list[self.deepstack.index(index)](x))
        merged = self.merger(x)
        if order is not None:  # the windows' group order back to the image's
            merged = merged[torch.argsort(order)]
        return torch.cat([merged, *stacked], dim=-1) if stacked else merged

    def _positions(self, t: int, h: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Each patch's (row, column) in the processor's merge-group order, repeated per frame."""
        m = self.merge
        rows = torch.arange(h)[:, None].expand(h, w).reshape(h // m, m, w // m, m).transpose(1, 2).flatten()
        cols = torch.arange(w)[None, :].expand(h, w).reshape(h // m, m, w // m, m).transpose(1, 2).flatten()
        return rows.repeat(t).float(), cols.repeat(t).float()

    def _learned_positions(self, h: int, w: int) -> torch.Tensor:
        """Qwen3-VL: the square table resized (bilinear, corners aligned) to h x w, in merge-group order."""
        side, m = self.side, self.merge
        table = self.pos_embed.weight.float().T.reshape(1, -1, side, side)
        grid = F.interpolate(table, size=(h, w), mode="bilinear", align_corners=True)[0]  # [D, h, w]
        grid = grid.reshape(-1, h // m, m, w // m, m).permute(1, 3, 2, 4, 0)
        return grid.reshape(h * w, -1)

    def _windows(self, t: int, h: int, w: int) -> tuple[torch.Tensor, list[int]]:
        """Qwen2.5-VL: merge groups ordered window by window (window_size pixels square) and each window's
        bounds in patches."""
        gh, gw = h // self.merge, w // self.merge
        size = self.window // self.merge // self.patch  # groups per window side
        index = torch.arange(t * gh * gw).reshape(t, gh, gw)
        pad_h, pad_w = size - gh % size, size - gw % size
        padded = F.pad(index, (0, pad_w, 0, pad_h), value=-1)
        nh, nw = (gh + pad_h) // size, (gw + pad_w) // size
        windows = padded.reshape(t, nh, size, nw, size).permute(0, 1, 3, 2, 4).reshape(t * nh * nw, -1)
        counts = (windows >= 0).sum(1)
        order = windows[windows >= 0]
        unit = self.merge * self.merge
        bounds = [0, *(int(c) for c in torch.cumsum(counts[counts > 0], 0) * unit)]
        return order, bounds

    def _by_group(self, x: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
        unit = self.merge * self.merge
        return x.view(-1, unit, x.shape[-1])[order].reshape(-1, x.shape[-1])


def load_qwen_vision(folder: Path, dtype: torch.dtype = torch.float32) -> QwenVisionTower | None:
    """The tower of a Qwen2.5-VL / Qwen3-VL / Qwen3.5 safetensors folder, its weights in `dtype`; None
    when the folder holds no tower weights."""
    config = json.loads((folder / "config.json").read_text())
    kind = config["model_type"]
    tower = QwenVisionTower(
        config["vision_config"], kind not in ("qwen2_vl", "qwen2_5_vl"), kind == "qwen2_vl"
    )
    state: dict[str, torch.Tensor] = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                for prefix in _PREFIXES:
                    if name.startswith(prefix):
                        state[name.removeprefix(prefix)] = f.get_tensor(name)
                        break
    if not state:
        return None
    conv = state.pop("patch_embed.proj.weight")
    state["patch_embed.weight"] = conv.reshape(conv.shape[0], -1)
    if "patch_embed.proj.bias" in state:
        state["patch_embed.bias"] = state.pop("patch_embed.proj.bias")
    tower.load_state_dict(state, strict=True)
    return tower.to(dtype).eval()


def encode_image(tower: QwenVisionTower, pixels: np.ndarray, grid: tuple[int, int, int]) -> torch.Tensor:
    """Numpy patches of one picture (the processor's) -> its embedding rows, on the tower's device."""
    weight = tower.patch_embed.weight
    patches = torch.from_numpy(np.ascontiguousarray(pixels, dtype=np.float32)).to(weight.device)
    return tower.encode(patches, grid)
