"""Gemma 4's image preprocessing: RGB, an aspect-preserving bicubic resize to the largest size whose sides
are multiples of patch x pooling kernel and whose patch count stays within max_soft_tokens x kernel^2,
then scale to [0, 1] (no mean/std: the tower maps to [-1, 1] itself). The arithmetic follows transformers'
Gemma4ImageProcessorPil (sizes, Pillow resize, scale in float64 then float32), so pixel values match it bit
for bit (tests/backends/test_gemma4_vision.py). Unlike Gemma 3 the number of image tokens depends on the
picture's shape: (rows / kernel) x (columns / kernel) of its patch grid."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

SUPPORTED_SOFT_TOKENS = (70, 140, 280, 560, 1120)  # the budgets the processor accepts


@dataclass(frozen=True)
class Gemma4ImageSpec:
    """What a checkpoint's preprocessor_config.json asks for (transformers' defaults otherwise)."""

    patch_size: int = 16
    max_soft_tokens: int = 280
    pooling_kernel_size: int = 3
    rescale: float = 1 / 255
    mean: tuple[float, float, float] | None = None  # only when the file sets do_normalize
    std: tuple[float, float, float] | None = None

    @classmethod
    def from_folder(cls, folder: Path, vision: dict[str, object]) -> Gemma4ImageSpec:
        """preprocessor_config.json (its `image_processor` block in a processor_config.json layout) where
        present; the vision config's patch and kernel sizes otherwise."""
        raw: dict[str, object] = {}
        for name in ("preprocessor_config.json", "processor_config.json"):
            if (folder / name).is_file():
                loaded = json.loads((folder / name).read_text())
                raw = loaded.get("image_processor", loaded) if isinstance(loaded, dict) else {}
                break
        patch = int(str(raw.get("patch_size", vision.get("patch_size", cls.patch_size))))
        kernel = int(str(raw.get("pooling_kernel_size", vision.get("pooling_kernel_size", 3))))
        tokens = int(str(raw.get("max_soft_tokens", raw.get("image_seq_length", cls.max_soft_tokens))))
        if tokens not in SUPPORTED_SOFT_TOKENS:
            raise ValueError(f"max_soft_tokens must be one of {SUPPORTED_SOFT_TOKENS}, got {tokens}")
        mean = std = None
        if raw.get("do_normalize"):
            m, s = raw.get("image_mean", [0.0] * 3), raw.get("image_std", [1.0] * 3)
            assert isinstance(m, list) and isinstance(s, list)
            mean = (float(m[0]), float(m[1]), float(m[2]))
            std = (float(s[0]), float(s[1]), float(s[2]))
        return cls(patch, tokens, kernel, float(str(raw.get("rescale_factor", 1 / 255))), mean, std)

    @property
    def max_patches(self) -> int:
        return self.max_soft_tokens * self.pooling_kernel_size**2


def target_size(height: int, width: int, spec: Gemma4ImageSpec) -> tuple[int, int]:
    """(height, width) after the resize; ValueError for a picture too thin to keep any patch row."""
    patch, kernel = spec.patch_size, spec.pooling_kernel_size
    factor = math.sqrt(spec.max_patches * patch**2 / (height * width))
    side = kernel * patch
    h = math.floor(factor * height / side) * side
    w = math.floor(factor * width / side) * side
    longest = (spec.max_patches // kernel**2) * side
    if h == 0 and w == 0:
        raise ValueError(f"a {width}x{height} picture is too small to cut into {side}-pixel tiles")
    if h == 0:  # a very wide picture: one tile row, as wide as its ratio allows
        h, w = side, min(math.floor(width / height) * side, longest)
    elif w == 0:
        w, h = side, min(math.floor(height / width) * side, longest)
    if h * w > spec.max_patches * patch**2:
        raise ValueError(f"a {width}x{height} picture does not fit {spec.max_patches} patches")
    return h, w


def soft_tokens(pixels: np.ndarray, spec: Gemma4ImageSpec) -> int:
    """The number of image tokens a preprocessed picture [3, H, W] becomes."""
    _, h, w = pixels.shape
    return (h // spec.patch_size) * (w // spec.patch_size) // spec.pooling_kernel_size**2


def preprocess(image: Image.Image, spec: Gemma4ImageSpec) -> np.ndarray:
    """One picture -> pixel values [3, H, W] float32 in [0, 1], H and W multiples of patch x kernel."""
    if "A" in image.getbands() or image.info.get("transparency") is not None:  # transparent -> on white
        background = Image.new("RGBA", image.size, (255, 255, 255, 255))
        image = Image.alpha_composite(background, image.convert("RGBA")).convert("RGB")
    elif image.mode != "RGB":
        image = image.convert("RGB")
    h, w = target_size(image.height, image.width, spec)
    if (h, w) != (image.height, image.width):
        image = image.resize((w, h), resample=Image.Resampling.BICUBIC)
    pixels = np.moveaxis(np.asarray(image), -1, 0)  # [3, H, W] uint8
    scaled = (pixels.astype(np.float64) * spec.rescale).astype(np.float32)
    if spec.mean is not None and spec.std is not None:
        mean = np.asarray(spec.mean, dtype=np.float32)[:, None, None]
        std = np.asarray(spec.std, dtype=np.float32)[:, None, None]
        scaled = np.asarray((scaled - mean) / std, dtype=np.float32)
    return scaled


def patches(pixels: np.ndarray, patch: int) -> tuple[np.ndarray, np.ndarray]:
    """[3, H, W] -> (patches [rows*cols, patch*patch*3] in row-major order, each patch's (x, y)
    [rows*cols, 2]): the processor's layout, which the tower's input projection expects."""
    c, h, w = pixels.shape
    rows, cols = h // patch, w // patch
    tiles = pixels.reshape(c, rows, patch, cols, patch).transpose(1, 3, 2, 4, 0).reshape(rows * cols, -1)
    xs, ys = np.meshgrid(np.arange(cols), np.arange(rows), indexing="xy")
    return np.ascontiguousarray(tiles), np.stack([xs, ys], axis=-1).reshape(rows * cols, 2)
