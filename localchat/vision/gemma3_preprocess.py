"""Gemma 3's image preprocessing: RGB, bilinear resize to the tower's square size, scale to [0, 1],
normalize by mean/std, channels first. The arithmetic order and dtypes are those of transformers'
Gemma3ImageProcessor (scale in float64 then round to float32, normalize in float32), so the pixel values
match it bit for bit (tests/backends/test_gemma3_vision.py). Pan-and-scan crops are not done: a
checkpoint's default leaves them off."""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image


@dataclass(frozen=True)
class ImageSpec:
    """What a checkpoint's preprocessor_config.json asks for."""

    size: int = 896
    mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    rescale: float = 1 / 255

    @classmethod
    def from_folder(cls, folder: Path, image_size: int) -> ImageSpec:
        """preprocessor_config.json where present; else the vision config's image_size and 0.5s."""
        path = folder / "preprocessor_config.json"
        if not path.exists():
            return cls(size=image_size)
        raw = json.loads(path.read_text())
        size = raw.get("size", {})
        mean = raw.get("image_mean", cls.mean)
        std = raw.get("image_std", cls.std)
        return cls(
            size=int(size.get("height", image_size)) if isinstance(size, dict) else int(size),
            mean=(float(mean[0]), float(mean[1]), float(mean[2])),
            std=(float(std[0]), float(std[1]), float(std[2])),
            rescale=float(raw.get("rescale_factor", 1 / 255)),
        )


def decode(data: bytes) -> Image.Image:
    """Bytes of a PNG/JPEG/WebP/GIF file -> a loaded Pillow image; ValueError for anything else."""
    try:
        image = Image.open(io.BytesIO(data))
        image.load()
    except Exception as exc:  # Pillow raises several types for bad input
        raise ValueError(f"not a readable image: {exc}") from exc
    return image


def content_hash(data: bytes) -> str:
    """The key the encoder cache and the prefix cache use for one picture."""
    return hashlib.sha256(data).hexdigest()


def preprocess(image: Image.Image, spec: ImageSpec) -> np.ndarray:
    """One image -> pixel values [3, size, size] float32."""
    # Transparent pixels are composited on white (as transformers does), so they do not turn black.
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        background = Image.new("RGBA", image.size, (255, 255, 255, 255))
        image = Image.alpha_composite(background, image.convert("RGBA")).convert("RGB")
    elif image.mode != "RGB":
        image = image.convert("RGB")
    resized = image.resize((spec.size, spec.size), resample=Image.Resampling.BILINEAR)
    pixels = np.moveaxis(np.asarray(resized), -1, 0)  # [3, H, W] uint8
    scaled = (pixels.astype(np.float64) * spec.rescale).astype(np.float32)
    mean = np.asarray(spec.mean, dtype=np.float32)[:, None, None]
    std = np.asarray(spec.std, dtype=np.float32)[:, None, None]
    return np.asarray((scaled - mean) / std, dtype=np.float32)
