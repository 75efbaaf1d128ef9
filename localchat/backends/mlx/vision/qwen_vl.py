"""The Qwen2.5-VL / Qwen3-VL / Qwen3.5 vision towers on MLX, the twin of
localchat/backends/torch/vision/qwen_vl.py: flattened patches through one matmul, 2-D rotary positions over
each patch's (row, column), bidirectional attention within the image (Qwen2.5-VL: within windows, except
the fullatt_block_indexes layers), then the 2x2 patch merger into the text model's width. Qwen3-VL adds
learned positions (bilinear, corners aligned, to the image's grid) and DeepStack rows concatenated after
the main ones. Weights are kept under the checkpoint's own names."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn
import numpy as np

_PREFIXES = ("model.visual.", "visual.")


class QwenVision:
    def __init__(self, config: dict[str, Any], weights: dict[str, mx.array]) -> None:
        vision = config["vision_config"]
        # Qwen2-VL: LayerNorm, quick-gelu MLP, no windows; its width is embed_dim, the text's hidden_size.
        self.qwen2 = config["model_type"] == "qwen2_vl"
        self.qwen3 = config["model_type"] not in ("qwen2_vl", "qwen2_5_vl")
        self.heads = int(vision["num_heads"])
        self.depth = int(vision["depth"])
        self.patch = int(vision.get("patch_size", 16 if self.qwen3 else 14))
        self.merge = int(vision.get("spatial_merge_size", 2))
        self.window = int(vision.get("window_size", 0))
        self.full_layers = frozenset(int(i) for i in vision.get("fullatt_block_indexes", ()))
        self.deepstack = [int(i) for i in vision.get("deepstack_visual_indexes", ())] if self.qwen3 else []
        self.hidden = int(vision["embed_dim"] if self.qwen2 else vision["hidden_size"])
        head_dim = self.hidden // self.heads
        theta = float((vision.get("rope_parameters") or {}).get("rope_theta", 10000.0))
        spatial = head_dim // 2
        exponents = np.arange(0, spatial, 2, dtype=np.float32) / np.float32(spatial)
        self.inv_freq = (1.0 / (theta**exponents)).astype(np.float32)
        self.w = weights
        conv = weights["patch_embed.proj.weight"]
        self.patch_matrix = conv.reshape(conv.shape[0], -1).T  # the Conv3d (stride == kernel) as a matmul
        mx.eval(self.patch_matrix)
        if self.qwen3:
            self.side = int(int(vision["num_position_embeddings"]) ** 0.5)

    @property
    def stacked(self) -> int:
        return 1 + len(self.deepstack)

    def encode(self, patches: mx.array, grid: tuple[int, int, int]) -> mx.array:
        """patches [t*h*w, C*T*P*P] in merge-group order, grid (t, h, w) in patches ->
        [t*h*w / merge^2, out_hidden * stacked]."""
        t, h, w = grid
        x = patches.astype(self.patch_matrix.dtype) @ self.patch_matrix
        if "patch_embed.proj.bias" in self.w:
            x = x + self.w["patch_embed.proj.bias"]
        rows, cols = self._positions(t, h, w)
        if self.qwen3:
            x = x + mx.tile(self._learned_positions(h, w), (t, 1)).astype(x.dtype)
        order: np.ndarray | None = None
        image_bounds = window_bounds = [0, int(x.shape[0])]
        if not self.qwen3 and self.window:
            order, window_bounds = self._windows(t, h, w)
            unit = self.merge * self.merge
            index = (order[:, None] * unit + np.arange(unit)[None, :]).reshape(-1)
            x = x[mx.array(index, dtype=mx.int32)]
            rows, cols = rows[index], cols[index]
        freqs = np.concatenate([rows[:, None] * self.inv_freq, cols[:, None] * self.inv_freq], axis=-1)
        emb = np.concatenate([freqs, freqs], axis=-1)[:, None, :]  # [T, 1, head_dim]
        cos, sin = mx.array(np.cos(emb)), mx.array(np.sin(emb))
        stacked: list[mx.array] = []
        for i in range(self.depth):
            full = self.qwen3 or i in self.full_layers
            x = self._block(x, f"blocks.{i}.", cos, sin, image_bounds if full else window_bounds)
            if i in self.deepstack:
                at = f"deepstack_merger_list.{self.deepstack.index(i)}."
                stacked.append(self._merger3(x, at, post_shuffle_norm=True))
        merged = self._merger3(x, "merger.", post_shuffle_norm=False) if self.qwen3 else self._merger25(x)
        if order is not None:  # the windows' group order back to the image's
            merged = merged[mx.array(np.argsort(order), dtype=mx.int32)]
        return mx.concatenate([merged, *stacked], axis=-1) if stacked else merged

    def _positions(self, t: int, h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
        m = self.merge
        rows = (
            np.broadcast_to(np.arange(h)[:, None], (h, w)).reshape(h // m, m, w // m, m).transpose(0, 2, 1, 3)
        )
        cols = (
            np.broadcast_to(np.arange(w)[None, :], (h, w)).reshape(h // m, m, w // m, m).transpose(0, 2, 1, 3)
        )
        return np.tile(rows.reshape(-1), t).astype(np.float32), np.tile(cols.reshape(-1), t).astype(
            np.float32
        )

    def _learned_positions(self, h: int, w: int) -> mx.array:
        """The square table resized bilinearly (corners aligned) to h x w, in merge-group order."""
        side, m = self.side, self.merge

        def taps(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            src = np.arange(n, dtype=np.float64) * (side - 1) / max(n - 1, 1)
            low = np.floor(src).astype(np.int64)
            return low, np.minimum(low + 1, side - 1), (src - low).astype(np.float32)

        r0, r1, fr = taps(h)
        c0, c1, fc = taps(w)
        table = self.w["pos_embed.weight"].astype(mx.float32)
        out = mx.zeros((h, w, table.shape[-1]), dtype=mx.float32)
        for rows, rw in ((r0, 1 - fr), (r1, fr)):
            for cols, cw in ((c0, 1 - fc), (c1, fc)):
                index = mx.array((rows[:, None] * side + cols[None, :]).reshape(-1), dtype=mx.int32)
                weight = mx.array((rw[:, None] * cw[None, :])[..., None])
                out = out + table[index].reshape(h, w, -1) * weight
        out = out.reshape(h // m, m, w // m, m, -1).transpose(0, 2, 1, 3, 4)
        return out.reshape(h * w, -1)

    def _windows(self, t: int, h: int, w: int) -> tuple[np.ndarray, list[int]]:
        gh, gw = h // self.merge, w // self.merge
        size = self.window // self.merge // self.patch
        index = np.arange(t * gh * gw).reshape(t, gh, gw)
        pad_h, pad_w = size - gh % size, size - gw % size
        padded = np.pad(index, ((0, 0), (0, pad_h), (0, pad_w)), constant_values=-1)
        nh, nw = (gh + pad_h) // size, (gw + pad_w) // size
        windows = padded.reshape(t, nh, size, nw, size).transpose(0, 1, 3, 2, 4).reshape(t * nh * nw, -1)
        counts = (windows >= 0).sum(1)
        unit = self.merge * self.merge
        bounds = [0, *(int(c) for c in np.cumsum(counts[counts > 0]) * unit)]
        return windows[windows >= 0], bounds

    def _block(self, x: mx.array, at: str, cos: mx.array, sin: mx.array, bounds: list[int]) -> mx.array:
        x = x + self._attention(self._norm(x, at + "norm1."), at + "attn.", cos, sin, bounds)
        h = self._norm(x, at + "norm2.")
        if self.qwen2:
            inner = self._linear(h, at + "mlp.fc1.")
            mlp = self._linear(inner * mx.sigmoid(1.702 * inner), at + "mlp.fc2.")
        elif self.qwen3:
            mlp = self._linear(
                mlx.nn.gelu_approx(self._linear(h, at + "mlp.linear_fc1.")), at + "mlp.linear_fc2."
            )
        else:
            gate, up = self._linear(h, at + "mlp.gate_proj."), self._linear(h, at + "mlp.up_proj.")
            mlp = self._linear(mlx.nn.silu(gate) * up, at + "mlp.down_proj.")
        return x + mlp

    def _attention(self, x: mx.array, at: str, cos: mx.array, sin: mx.array, bounds: list[int]) -> mx.array:
        t = x.shape[0]
        qkv = self._linear(x, at + "qkv.").reshape(t, 3, self.heads, -1)
        q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]  # [T, heads, d]
        q = (q.astype(mx.float32) * cos + _rotate_half(q.astype(mx.float32)) * sin).astype(x.dtype)
        k = (k.astype(mx.float32) * cos + _rotate_half(k.astype(mx.float32)) * sin).astype(x.dtype)
        q, k, v = (a.transpose(1, 0, 2)[None] for a in (q, k, v))  # [1, heads, T, d]
        scale = q.shape[-1] ** -0.5
        outs = [
            mx.fast.scaled_dot_product_attention(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], scale=scale)
            for a, b in itertools.pairwise(bounds)
        ]
        out = outs[0] if len(outs) == 1 else mx.concatenate(outs, axis=2)
        return self._linear(out[0].transpose(1, 0, 2).reshape(t, -1), at + "proj.")

    def _merger25(self, x: mx.array) -> mx.array:
        grouped = self.hidden * self.merge * self.merge
        if self.qwen2:
            h = mx.fast.layer_norm(x, self.w["merger.ln_q.weight"], self.w["merger.ln_q.bias"], 1e-6)
        else:
            h = mx.fast.rms_norm(x, self.w["merger.ln_q.weight"], 1e-6)
        h = h.reshape(-1, grouped)
        h = mlx.nn.gelu(self._linear(h, "merger.mlp.0."))
        return self._linear(h, "merger.mlp.2.")

    def _merger3(self, x: mx.array, at: str, post_shuffle_norm: bool) -> mx.array:
        grouped = self.hidden * self.merge * self.merge
        w, b = self.w[at + "norm.weight"], self.w[at + "norm.bias"]
        if post_shuffle_norm:
            h = mx.fast.layer_norm(x.reshape(-1, grouped), w, b, 1e-6)
        else:
            h = mx.fast.layer_norm(x, w, b, 1e-6).reshape(-1, grouped)
        return self._linear(mlx.nn.gelu(self._linear(h, at + "linear_fc1.")), at + "linear_fc2.")

    def _norm(self, x: mx.array, at: str) -> mx.array:
        if self.qwen3 or self.qwen2:
            return mx.fast.layer_norm(x, self.w[at + "weight"], self.w[at + "bias"], 1e-6)
        return mx.fast.rms_norm(x, self.w[at + "weight"], 1e-6)

    def _linear(self, x: mx.array, at: str) -> mx.array:
        y = x @ self.w[at + "weight"].T
        bias = self.w.get(at + "bias")
        return y if bias is None else y + bias


def _rotate_half(x: mx.array) -> mx.array:
    half = x.shape[-1] // 2
    return mx.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def load_qwen_vision(folder: Path, dtype: mx.Dtype = mx.float32) -> QwenVision | None:
    """The tower of a Qwen2.5-VL / Qwen3-VL / Qwen3.5 folder in `dtype`; None when it holds no tower."""
    config = json.loads((folder / "config.json").read_text())
    weights: dict[str, mx.array] = {}
    for path in sorted(folder.glob("*.safetensors")):
        for name, value in mx.load(str(path)).items():  # type: ignore[union-attr]
            for prefix in _PREFIXES:
                if name.startswith(prefix):
                    weights[name.removeprefix(prefix)] = value.astype(dtype)
                    break
    if not weights:
        return None
    mx.eval(list(weights.values()))
    return QwenVision(config, weights)
