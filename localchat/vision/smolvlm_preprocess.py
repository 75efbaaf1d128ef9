"""SmolVLM / Idefics3 image preprocessing: RGB; the longest edge resized to `size.longest_edge` (upscaling
small pictures too); each side rounded up to a multiple of the tile (`max_image_size.longest_edge`); the
picture cut into rows x cols tiles, then the whole picture squeezed to one more tile (the global image);
scale to [0, 1] and normalize. Every size, Pillow call (Lanczos by default) and the float64-then-float32
arithmetic are those of transformers' SmolVLMImageProcessorPil / Idefics3ImageProcessorPil, so the pixel
values match bit for bit (tests/backends/test_smolvlm_vision.py)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from localchat.vision.clip_preprocess import _rgb  # transparency on white, as transformers does

MAX_SIDE = 4096  # the processors' cap on a resized side, whatever `size` asks


@dataclass(frozen=True)
class SmolVLMImageSpec:
    """What a checkpoint's preprocessor_config.json asks for (the processors' defaults otherwise)."""

    longest_edge: int = 4 * 364
    tile: int = 364
    split: bool = True
    mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    rescale: float = 1 / 255
    resample: int = int(Image.Resampling.LANCZOS)

    @classmethod
    def from_folder(cls, folder: Path, tile: int) -> SmolVLMImageSpec:
        """`tile`: the tower's image_size, used when the folder has no preprocessor_config.json."""
        path = folder / "preprocessor_config.json"
        if not path.is_file():
            return cls(longest_edge=4 * tile, tile=tile)
        return cls.from_dict(json.loads(path.read_text()), tile)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], tile: int) -> SmolVLMImageSpec:
        tile = int(raw.get("max_image_size", {}).get("longest_edge", tile))
        mean, std = raw.get("image_mean", cls.mean), raw.get("image_std", cls.std)
        return cls(
            longest_edge=int(raw.get("size", {}).get("longest_edge", 4 * tile)),
            tile=tile,
            split=bool(raw.get("do_image_splitting", True)),
            mean=(float(mean[0]), float(mean[1]), float(mean[2])),
            std=(float(std[0]), float(std[1]), float(std[2])),
            rescale=float(raw.get("rescale_factor", 1 / 255)),
            resample=int(raw.get("resample", int(Image.Resampling.LANCZOS))),
        )


def _resize(pixels: np.ndarray, height: int, width: int, resample: int) -> np.ndarray:
    image = Image.fromarray(np.moveaxis(pixels, 0, -1))
    resized = image.resize((width, height), resample=Image.Resampling(resample), reducing_gap=None)
    return np.moveaxis(np.asarray(resized), -1, 0)


def _longest_edge_size(height: int, width: int, edge: int) -> tuple[int, int]:
    """The longest side to `edge`, the other kept in proportion and rounded up to even, then both under
    MAX_SIDE (the processors' two steps, in their integer arithmetic)."""
    aspect = width / height
    if width >= height:
        width, height = edge, int(edge / aspect)
        height += height % 2
    else:
        height, width = edge, int(edge * aspect)
        width += width % 2
    height, width = max(height, 1), max(width, 1)
    aspect = width / height
    if width >= height and width > MAX_SIDE:
        width, height = MAX_SIDE, int(MAX_SIDE / aspect)
    elif height > width and height > MAX_SIDE:
        height, width = MAX_SIDE, int(MAX_SIDE * aspect)
    return max(height, 1), max(width, 1)


def _tile_multiple_size(height: int, width: int, tile: int) -> tuple[int, int]:
    aspect = width / height
    if width >= height:
        width = math.ceil(width / tile) * tile
        height = math.ceil(int(width / aspect) / tile) * tile
    else:
        height = math.ceil(height / tile) * tile
        width = math.ceil(int(height * aspect) / tile) * tile
    return height, width


def preprocess_smolvlm(image: Image.Image, spec: SmolVLMImageSpec) -> tuple[np.ndarray, tuple[int, int]]:
    """One picture -> (pixel values [tiles, 3, tile, tile] float32, (rows, cols)): rows x cols tiles in
    row-major order then the global image, or the global image alone with (0, 0) when the picture fits
    one tile (or splitting is off)."""
    pixels = _rgb(image)
    height, width = pixels.shape[1:]
    pixels = _resize(pixels, *_longest_edge_size(height, width, spec.longest_edge), spec.resample)
    t = spec.tile
    rows = cols = 0
    if spec.split:
        height, width = pixels.shape[1:]
        pixels = _resize(pixels, *_tile_multiple_size(height, width, t), spec.resample)
        height, width = pixels.shape[1:]
        if height > t or width > t:
            rows, cols = height // t, width // t
            tiles = [
                pixels[:, r * t : (r + 1) * t, c * t : (c + 1) * t] for r in range(rows) for c in range(cols)
            ]
            frames = [*tiles, _resize(pixels, t, t, spec.resample)]
        else:
            frames = [pixels]
    else:
        frames = [_resize(pixels, t, t, spec.resample)]
    scaled = (np.stack(frames).astype(np.float64) * spec.rescale).astype(np.float32)
    mean = np.asarray(spec.mean, dtype=np.float32)[:, None, None]
    std = np.asarray(spec.std, dtype=np.float32)[:, None, None]
    return np.ascontiguousarray((scaled - mean) / std, dtype=np.float32), (rows, cols)
