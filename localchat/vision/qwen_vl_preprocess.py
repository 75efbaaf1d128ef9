"""Qwen2-VL / Qwen2.5-VL / Qwen3-VL image preprocessing, as transformers' Qwen2VLImageProcessorPil does it:
RGB, `smart_resize` (each side a multiple of patch * merge, the pixel count between min and max, the aspect
ratio kept), bicubic resize, scale to [0, 1] and normalise, then cut into patches laid out merge group by
merge group: [grid_h * grid_w, C * temporal_patch_size * patch * patch], a still image repeated along the
temporal axis. The pixel values equal the processor's bit for bit (tests/backends/test_vision_qwen_vl.py)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True)
class QwenImageSpec:
    """What a checkpoint's preprocessor_config.json asks for (defaults: Qwen2-VL's processor)."""

    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    mean: tuple[float, float, float] = CLIP_MEAN
    std: tuple[float, float, float] = CLIP_STD
    rescale: float = 1 / 255

    @classmethod
    def from_folder(cls, folder: Path, vision: dict[str, Any]) -> QwenImageSpec:
        """preprocessor_config.json where present; else the vision config's patch and merge sizes."""
        patch = int(vision.get("patch_size", cls.patch_size))
        merge = int(vision.get("spatial_merge_size", cls.merge_size))
        temporal = int(vision.get("temporal_patch_size", cls.temporal_patch_size))
        path = folder / "preprocessor_config.json"
        raw: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
        size: dict[str, Any] = raw["size"] if isinstance(raw.get("size"), dict) else {}
        mean, std = raw.get("image_mean", cls.mean), raw.get("image_std", cls.std)
        return cls(
            patch_size=int(raw.get("patch_size", patch)),
            merge_size=int(raw.get("merge_size", merge)),
            temporal_patch_size=int(raw.get("temporal_patch_size", temporal)),
            min_pixels=int(raw.get("min_pixels") or size.get("shortest_edge") or cls.min_pixels),
            max_pixels=int(raw.get("max_pixels") or size.get("longest_edge") or cls.max_pixels),
            mean=(float(mean[0]), float(mean[1]), float(mean[2])),
            std=(float(std[0]), float(std[1]), float(std[2])),
            rescale=float(raw.get("rescale_factor", 1 / 255)),
        )


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """The resized (height, width): multiples of `factor`, pixel count within [min_pixels, max_pixels]."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"a {width}x{height} image is too narrow: the aspect ratio must be below 200")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def preprocess_qwen(image: Image.Image, spec: QwenImageSpec) -> tuple[np.ndarray, tuple[int, int, int]]:
    """One image -> (patches float32 [grid_h * grid_w, C * T * P * P], patch grid (1, grid_h, grid_w))."""
    image = _to_rgb(image)
    p, m, t = spec.patch_size, spec.merge_size, spec.temporal_patch_size
    height, width = smart_resize(image.height, image.width, p * m, spec.min_pixels, spec.max_pixels)
    resized = image.resize((width, height), resample=Image.Resampling.BICUBIC)
    pixels = np.moveaxis(np.asarray(resized), -1, 0)  # [3, H, W] uint8
    scaled = (pixels.astype(np.float64) * spec.rescale).astype(np.float32)
    mean = np.asarray(spec.mean, dtype=np.float32)[:, None, None]
    std = np.asarray(spec.std, dtype=np.float32)[:, None, None]
    normed = np.asarray((scaled - mean) / std, dtype=np.float32)
    grid_h, grid_w = height // p, width // p
    # Patches in merge-group order (each 2x2 group of neighbours together), channels, then the pixels.
    patches = normed.reshape(3, grid_h // m, m, p, grid_w // m, m, p).transpose(1, 4, 2, 5, 0, 3, 6)
    repeated = np.broadcast_to(patches[:, :, :, :, :, None], (*patches.shape[:5], t, p, p))
    flat = np.ascontiguousarray(repeated.reshape(grid_h * grid_w, 3 * t * p * p), dtype=np.float32)
    return flat, (1, grid_h, grid_w)


def _to_rgb(image: Image.Image) -> Image.Image:
    # Transparent pixels are composited on white (as transformers does), so they do not turn black.
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        background = Image.new("RGBA", image.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, image.convert("RGBA")).convert("RGB")
    return image if image.mode == "RGB" else image.convert("RGB")
