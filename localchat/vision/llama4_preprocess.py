"""Llama 4 image preprocessing, as transformers' Llama4ImageProcessor does it (a torchvision-only
processor), without torch: RGB; the canvas of whole tiles (`size`, 336 px) that scales the picture least
among the rows x cols layouts of at most `max_patches` tiles; the picture resized into it without
distortion (never enlarged past one tile), padded right and bottom with black, cut into tiles; plus, when
there is more than one tile, the whole picture squeezed to one tile (the global image).

Two details make the values bit-equal (tests/backends/test_llama4_vision.py): the resize is torch's uint8
antialiased bilinear (int16 fixed-point weights, the horizontal pass first), which differs from Pillow's
by one level here and there; and the rescale and normalisation run in bfloat16, so the pixel values are
bfloat16 numbers (held here as float32)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from localchat.vision.clip_preprocess import _rgb  # transparency on white, as transformers does


@dataclass(frozen=True)
class Llama4ImageSpec:
    """What a checkpoint's preprocessor_config.json asks for (the processor's defaults otherwise)."""

    tile: int = 336
    max_patches: int = 16
    resize_to_max_canvas: bool = False
    mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    rescale: float = 1 / 255

    @classmethod
    def from_folder(cls, folder: Path) -> Llama4ImageSpec:
        path = folder / "preprocessor_config.json"
        return cls.from_dict(json.loads(path.read_text())) if path.is_file() else cls()

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Llama4ImageSpec:
        size = raw.get("size") or {}
        height, width = int(size.get("height", 336)), int(size.get("width", 336))
        if height != width:
            raise ValueError(f"Llama 4 tiles are square; preprocessor_config.json asks for {height}x{width}")
        resample = int(raw.get("resample", int(Image.Resampling.BILINEAR)))
        if resample != int(Image.Resampling.BILINEAR):
            raise ValueError(f"Llama 4 preprocessing supports bilinear resizing only (resample {resample})")
        mean, std = raw.get("image_mean", cls.mean), raw.get("image_std", cls.std)
        return cls(
            tile=height,
            max_patches=int(raw.get("max_patches", 16)),
            resize_to_max_canvas=bool(raw.get("resize_to_max_canvas", False)),
            mean=(float(mean[0]), float(mean[1]), float(mean[2])),
            std=(float(std[0]), float(std[1]), float(std[2])),
            rescale=float(raw.get("rescale_factor", 1 / 255)),
        )


def supported_canvases(max_patches: int, tile: int) -> list[tuple[int, int]]:
    """(height, width) in px of every rows x cols layout of at most `max_patches` tiles, grouped by aspect
    ratio in the processor's order (its tie-break picks the first of equal areas)."""
    by_ratio: dict[float, list[tuple[int, int]]] = {}
    for count in range(max_patches, 0, -1):
        for rows in sorted(d for d in range(1, count + 1) if count % d == 0):
            by_ratio.setdefault(rows / (count // rows), []).append((rows, count // rows))
    return [(r * tile, c * tile) for layouts in by_ratio.values() for r, c in layouts]


def best_canvas(height: int, width: int, canvases: list[tuple[int, int]], to_max: bool) -> tuple[int, int]:
    """The canvas the picture fits by the smallest enlargement (or the least shrinking), smallest area on a
    tie; scales in float32, as the processor computes them."""
    sizes = np.asarray(canvases, dtype=np.float32)
    scales = np.minimum(sizes[:, 0] / np.float32(height), sizes[:, 1] / np.float32(width))
    up = scales[scales >= 1]
    chosen = (up.max() if to_max else up.min()) if len(up) else scales[scales < 1].max()
    candidates = [c for c, s in zip(canvases, scales, strict=True) if s == chosen]
    return min(candidates, key=lambda c: c[0] * c[1])  # min keeps the first of equal areas


def fit_size(height: int, width: int, target: tuple[int, int]) -> tuple[int, int]:
    """The largest size within `target` that keeps the picture's aspect ratio (floored)."""
    scale_w, scale_h = target[1] / width, target[0] / height
    if scale_w < scale_h:
        return max(min(math.floor(height * scale_w), target[0]), 1), max(target[1], 1)
    return max(target[0], 1), max(min(math.floor(width * scale_h), target[1]), 1)


def _weights(size_in: int, size_out: int) -> tuple[np.ndarray, np.ndarray, int]:
    """torch's antialiased bilinear weights for one axis: (first input index per output [out], int16-rounded
    weights [out, taps], precision bits)."""
    scale = size_in / size_out
    support = scale if scale >= 1.0 else 1.0
    inv = 1.0 / scale if scale >= 1.0 else 1.0
    starts, rows = [], []
    for i in range(size_out):
        center = scale * (i + 0.5)
        lo = max(int(center - support + 0.5), 0)
        hi = min(int(center + support + 0.5), size_in)
        taps = np.maximum(0.0, 1.0 - np.abs((np.arange(lo, hi) - center + 0.5) * inv))
        total = taps.sum()
        starts.append(lo)
        rows.append(taps / total if total != 0.0 else taps)
    width = max(len(r) for r in rows)
    weights = np.zeros((size_out, width))
    for i, r in enumerate(rows):
        weights[i, : len(r)] = r
    peak = float(weights.max())
    precision = 0
    while precision < 22 and int(0.5 + peak * (1 << (precision + 1))) < (1 << 15):
        precision += 1
    scaled = weights * (1 << precision)
    rounded = np.where(scaled < 0, np.trunc(scaled - 0.5), np.trunc(scaled + 0.5)).astype(np.int64)
    return np.asarray(starts), rounded, precision


def _resample_axis(pixels: np.ndarray, size_out: int, axis: int) -> np.ndarray:
    """One separable pass over `axis` of uint8 [3, H, W], in torch's fixed-point arithmetic."""
    size_in = pixels.shape[axis]
    if size_in == size_out:
        return pixels
    starts, weights, precision = _weights(size_in, size_out)
    moved = np.moveaxis(pixels, axis, -1).astype(np.int64)
    padded = np.concatenate([moved, np.zeros((*moved.shape[:-1], weights.shape[1]), np.int64)], axis=-1)
    index = starts[:, None] + np.arange(weights.shape[1])[None, :]  # [out, taps]
    total = (padded[..., index] * weights).sum(-1) + (1 << (precision - 1))
    return np.moveaxis(np.clip(total >> precision, 0, 255).astype(np.uint8), -1, axis)


def resize_bilinear(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    """uint8 [3, H, W] -> [3, height, width]: torch's antialiased bilinear on uint8 (width first)."""
    return _resample_axis(_resample_axis(pixels, width, 2), height, 1)


def _bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> the nearest bfloat16 (ties to even), held as float32."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    bits = (bits + (((bits >> 16) & 1) + 0x7FFF)) & np.uint32(0xFFFF0000)
    return bits.view(np.float32)


def _normalize(pixels: np.ndarray, spec: Llama4ImageSpec) -> np.ndarray:
    """uint8 -> bfloat16 values: (x * rescale) then (- mean) then (/ std), each rounded to bfloat16."""
    mean = _bf16(np.asarray(spec.mean, dtype=np.float32))[:, None, None]
    std = _bf16(np.asarray(spec.std, dtype=np.float32))[:, None, None]
    scaled = _bf16(pixels.astype(np.float32) * np.float32(spec.rescale))
    return _bf16(_bf16(scaled - mean) / std)


def preprocess_llama4(image: Image.Image, spec: Llama4ImageSpec) -> tuple[np.ndarray, tuple[int, int]]:
    """One picture -> (pixel values [tiles, 3, S, S] float32, (rows, cols)): rows x cols tiles in
    row-major order, then the global image when there is more than one tile."""
    pixels = _rgb(image)
    height, width = pixels.shape[1:]
    t = spec.tile
    canvas = best_canvas(height, width, supported_canvases(spec.max_patches, t), spec.resize_to_max_canvas)
    bound = canvas
    if not spec.resize_to_max_canvas:  # never enlarge past one tile
        bound = (min(max(height, t), canvas[0]), min(max(width, t), canvas[1]))
    new_h, new_w = fit_size(height, width, bound)
    resized = resize_bilinear(pixels, new_h, new_w)
    padded = np.zeros((3, *canvas), dtype=np.uint8)
    padded[:, :new_h, :new_w] = resized
    rows, cols = canvas[0] // t, canvas[1] // t
    tiles = [padded[:, r * t : (r + 1) * t, c * t : (c + 1) * t] for r in range(rows) for c in range(cols)]
    if rows * cols > 1:
        tiles.append(resize_bilinear(pixels, t, t))
    return np.ascontiguousarray(_normalize(np.stack(tiles), spec)), (rows, cols)
