"""Pixtral image preprocessing (Mistral Small 3.x, Pixtral): RGB, a bicubic resize that keeps the aspect
ratio, shrinks the picture to fit `longest_edge` and rounds each side up to a multiple of the patch unit
(the tower's patch x the projector's spatial merge), then scale to [0, 1] and normalise with CLIP's
mean/std. No crop, no padding: each picture keeps its own size, so its token grid follows its shape.
Every step is transformers' Pillow backend's (PixtralImageProcessorPil with the processor's patch unit):
the same floor-then-ceil size arithmetic, Pillow call and float64-then-float32 scaling, so the pixel
values match bit for bit (tests/backends/test_pixtral_vision.py)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from localchat.vision.clip_preprocess import CLIP_MEAN, CLIP_STD, _rgb


@dataclass(frozen=True)
class PixtralImageSpec:
    """What a checkpoint's preprocessor_config.json asks for; `unit` is the side every resized picture is
    a multiple of (PixtralProcessor passes patch_size x spatial_merge_size to the image processor)."""

    longest_edge: int = 1540
    unit: int = 28
    mean: tuple[float, float, float] = CLIP_MEAN
    std: tuple[float, float, float] = CLIP_STD
    rescale: float = 1 / 255
    resample: int = int(Image.Resampling.BICUBIC)

    @classmethod
    def from_folder(cls, folder: Path, unit: int, longest_edge: int) -> PixtralImageSpec:
        """preprocessor_config.json where present, else the defaults at the tower's image size."""
        path = folder / "preprocessor_config.json"
        raw = json.loads(path.read_text()) if path.is_file() else {}
        return cls.from_dict(raw, unit, longest_edge)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], unit: int, longest_edge: int) -> PixtralImageSpec:
        size = raw.get("size", {"longest_edge": longest_edge})
        if isinstance(size, int):
            size = {"longest_edge": size}
        mean, std = raw.get("image_mean", CLIP_MEAN), raw.get("image_std", CLIP_STD)
        return cls(
            longest_edge=int(size.get("longest_edge", longest_edge)),
            unit=unit,
            mean=(float(mean[0]), float(mean[1]), float(mean[2])),
            std=(float(std[0]), float(std[1]), float(std[2])),
            rescale=float(raw.get("rescale_factor", 1 / 255)),
            resample=int(raw.get("resample", int(Image.Resampling.BICUBIC))),
        )


def resized_size(height: int, width: int, spec: PixtralImageSpec) -> tuple[int, int]:
    """(height, width) after the resize: shrunk (floored) to fit the longest edge, then each side rounded
    up to a multiple of the unit; a picture smaller than the limit is only rounded up."""
    ratio = max(height / spec.longest_edge, width / spec.longest_edge)
    if ratio > 1:
        height, width = math.floor(height / ratio), math.floor(width / ratio)
    return (
        ((height - 1) // spec.unit + 1) * spec.unit,
        ((width - 1) // spec.unit + 1) * spec.unit,
    )


def preprocess_pixtral(image: Image.Image, spec: PixtralImageSpec) -> np.ndarray:
    """One image -> pixel values [3, height, width] float32, both sides multiples of `spec.unit`."""
    pixels = _rgb(image)
    new_h, new_w = resized_size(pixels.shape[1], pixels.shape[2], spec)
    resized = Image.fromarray(np.moveaxis(pixels, 0, -1)).resize(
        (new_w, new_h), resample=Image.Resampling(spec.resample), reducing_gap=None
    )
    scaled = (np.moveaxis(np.asarray(resized), -1, 0).astype(np.float64) * spec.rescale).astype(np.float32)
    mean = np.asarray(spec.mean, dtype=np.float32)[:, None, None]
    std = np.asarray(spec.std, dtype=np.float32)[:, None, None]
    return np.ascontiguousarray((scaled - mean) / std, dtype=np.float32)
