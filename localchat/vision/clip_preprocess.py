"""CLIP-style image preprocessing (LLaVA 1.5 and the fine-tunes built on it): RGB, optionally padded to a
square with the mean colour (LlavaImageProcessor's do_pad, the original LLaVA 1.5's "pad" aspect ratio),
bicubic resize of the shortest edge, center crop, scale to [0, 1], normalize with CLIP's mean/std.
Every step is transformers' Pillow backend's (CLIPImageProcessorPil / LlavaImageProcessorPil): the same
resize sizes, Pillow call, crop offsets and float64-then-float32 arithmetic, so the pixel values match
bit for bit (tests/backends/test_vision_llava.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True)
class ClipImageSpec:
    """What a checkpoint's preprocessor_config.json asks for (CLIP's defaults at LLaVA 1.5's 336)."""

    shortest_edge: int = 336
    crop: tuple[int, int] = (336, 336)  # (height, width)
    mean: tuple[float, float, float] = CLIP_MEAN
    std: tuple[float, float, float] = CLIP_STD
    rescale: float = 1 / 255
    resample: int = int(Image.Resampling.BICUBIC)
    center_crop: bool = True
    pad_to_square: bool = False

    @classmethod
    def from_folder(cls, folder: Path, image_size: int) -> ClipImageSpec:
        """preprocessor_config.json where present, else CLIP's defaults at the tower's image size."""
        path = folder / "preprocessor_config.json"
        if not path.is_file():
            return cls(shortest_edge=image_size, crop=(image_size, image_size))
        return cls.from_dict(json.loads(path.read_text()), image_size)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], image_size: int) -> ClipImageSpec:
        size = raw.get("size", {"shortest_edge": image_size})
        if isinstance(size, int):
            size = {"shortest_edge": size}
        crop = raw.get("crop_size", {"height": image_size, "width": image_size})
        if isinstance(crop, int):
            crop = {"height": crop, "width": crop}
        mean, std = raw.get("image_mean", CLIP_MEAN), raw.get("image_std", CLIP_STD)
        return cls(
            shortest_edge=int(size.get("shortest_edge", size.get("height", image_size))),
            crop=(int(crop["height"]), int(crop["width"])),
            mean=(float(mean[0]), float(mean[1]), float(mean[2])),
            std=(float(std[0]), float(std[1]), float(std[2])),
            rescale=float(raw.get("rescale_factor", 1 / 255)),
            resample=int(raw.get("resample", int(Image.Resampling.BICUBIC))),
            center_crop=bool(raw.get("do_center_crop", True)),
            pad_to_square=bool(raw.get("do_pad", False)),
        )


def _rgb(image: Image.Image) -> np.ndarray:
    """[3, H, W] uint8; transparency composited on white, as transformers does."""
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        background = Image.new("RGBA", image.size, (255, 255, 255, 255))
        image = Image.alpha_composite(background, image.convert("RGBA")).convert("RGB")
    elif image.mode != "RGB":
        image = image.convert("RGB")
    return np.moveaxis(np.asarray(image), -1, 0)


def _pad_square(pixels: np.ndarray, mean: tuple[float, float, float]) -> np.ndarray:
    channels, height, width = pixels.shape
    if height == width:
        return pixels
    side = max(height, width)
    out = np.empty((channels, side, side), dtype=pixels.dtype)
    for c, value in enumerate(mean):
        out[c] = int(value * 255)
    start = (side - min(height, width)) // 2
    if width > height:
        out[:, start : start + height, :] = pixels
    else:
        out[:, :, start : start + width] = pixels
    return out


def _resize_shortest(pixels: np.ndarray, edge: int, resample: int) -> np.ndarray:
    _, height, width = pixels.shape
    short, long = (width, height) if width <= height else (height, width)
    new_long = int(edge * long / short)
    new_h, new_w = (new_long, edge) if width <= height else (edge, new_long)
    image = Image.fromarray(np.moveaxis(pixels, 0, -1))
    resized = image.resize((new_w, new_h), resample=Image.Resampling(resample), reducing_gap=None)
    return np.moveaxis(np.asarray(resized), -1, 0)


def _center_crop(pixels: np.ndarray, crop: tuple[int, int]) -> np.ndarray:
    _, height, width = pixels.shape
    crop_h, crop_w = crop
    top, left = (height - crop_h) // 2, (width - crop_w) // 2
    if top >= 0 and left >= 0:
        return pixels[:, top : top + crop_h, left : left + crop_w]
    # smaller than the crop: zero-padded around the middle first, as transformers does
    new_h, new_w = max(crop_h, height), max(crop_w, width)
    padded = np.zeros((pixels.shape[0], new_h, new_w), dtype=pixels.dtype)
    pad_top, pad_left = -(-(new_h - height) // 2), -(-(new_w - width) // 2)
    padded[:, pad_top : pad_top + height, pad_left : pad_left + width] = pixels
    top, left = top + pad_top, left + pad_left
    return padded[:, max(0, top) : min(new_h, top + crop_h), max(0, left) : min(new_w, left + crop_w)]


def preprocess_clip(image: Image.Image, spec: ClipImageSpec) -> np.ndarray:
    """One image -> pixel values [3, crop height, crop width] float32."""
    pixels = _rgb(image)
    if spec.pad_to_square:
        pixels = _pad_square(pixels, spec.mean)
    pixels = _resize_shortest(pixels, spec.shortest_edge, spec.resample)
    if spec.center_crop:
        pixels = _center_crop(pixels, spec.crop)
    scaled = (pixels.astype(np.float64) * spec.rescale).astype(np.float32)
    mean = np.asarray(spec.mean, dtype=np.float32)[:, None, None]
    std = np.asarray(spec.std, dtype=np.float32)[:, None, None]
    return np.ascontiguousarray((scaled - mean) / std, dtype=np.float32)
