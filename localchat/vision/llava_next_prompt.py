"""The server's side of a LLaVA-NeXT (LLaVA 1.6, LlavaNextForConditionalGeneration) image prompt, without
torch. "anyres": each picture is resized into the best of the config's `image_grid_pinpoints` resolutions
(aspect ratio kept, zero-padded to it), cut into tiles of the tower's size, and preceded by the whole
picture squashed to one tile. The tower's features of the tiles are stitched back into one grid, the rows
and columns that only cover the padding are dropped, and an `image_newline` row ends each feature row, so
the number of image tokens depends on the picture's size (the same arithmetic as LlavaNextProcessor).
Pixels match LlavaNextImageProcessor's Pillow backend bit for bit (tests/backends/test_vision_llava_next.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from localchat.vision.clip_preprocess import ClipImageSpec, _rgb, preprocess_clip

IMAGE = "<image>"
LLAVA_NEXT_TYPES = frozenset({"llava_next"})
DEFAULT_PINPOINTS = ((336, 672), (672, 336), (672, 672), (1008, 336), (336, 1008))


@dataclass(frozen=True, slots=True)
class AnyresPixels:
    """One picture for the tower: the squashed whole picture then the tiles, row by row [1 + tiles, 3, S, S]
    float32, and the picture's own (height, width), which the feature unpadding needs."""

    tiles: np.ndarray
    image_size: tuple[int, int]


def best_resolution(size: tuple[int, int], pinpoints: tuple[tuple[int, int], ...]) -> tuple[int, int]:
    """The (height, width) that keeps the most of the picture's pixels, then wastes the fewest."""
    height, width = size
    best, most, least_waste = pinpoints[0], 0, math.inf
    for h, w in pinpoints:
        scale = min(w / width, h / height)
        kept = min(int(width * scale) * int(height * scale), width * height)
        waste = w * h - kept
        if kept > most or (kept == most and waste < least_waste):
            best, most, least_waste = (h, w), kept, waste
    return best


def fitted_size(size: tuple[int, int], target: tuple[int, int]) -> tuple[int, int]:
    """The picture's (height, width) scaled to fit `target`, aspect ratio kept."""
    height, width = size
    target_h, target_w = target
    if target_w / width < target_h / height:
        return min(math.ceil(height * target_w / width), target_h), target_w
    return target_h, min(math.ceil(width * target_h / height), target_w)


def unpadded_bounds(size: tuple[int, int], grid: tuple[int, int]) -> tuple[int, int, int, int]:
    """(top, bottom, left, right) of the part of a (rows, columns) feature grid that covers the picture
    rather than the padding around it."""
    height, width = size
    rows, columns = grid
    if width / height > columns / rows:
        padding = (rows - int(round(height * (columns / width), 7))) // 2
        return padding, rows - padding, 0, columns
    padding = (columns - int(round(width * (rows / height), 7))) // 2
    return 0, rows, padding, columns - padding


def _resize(pixels: np.ndarray, size: tuple[int, int], resample: int) -> np.ndarray:
    image = Image.fromarray(np.moveaxis(pixels, 0, -1))
    resized = image.resize((size[1], size[0]), resample=Image.Resampling(resample), reducing_gap=None)
    return np.moveaxis(np.asarray(resized), -1, 0)


@dataclass(frozen=True, slots=True)
class LlavaNextImagePrompt:
    spec: ClipImageSpec
    pinpoints: tuple[tuple[int, int], ...]
    tile: int  # the tower's image size: tiles are tile x tile pixels
    patch: int
    image_token_id: int

    @classmethod
    def from_config(cls, path: Path, config: dict[str, Any]) -> LlavaNextImagePrompt:
        """`path`: the folder (its preprocessor_config.json), or a GGUF whose config came from its mmproj."""
        vision = config["vision_config"]
        tile = int(vision.get("image_size", 336))
        pinpoints = tuple((int(h), int(w)) for h, w in config.get("image_grid_pinpoints", DEFAULT_PINPOINTS))
        token = int(config.get("image_token_index", config.get("image_token_id", 32_000)))
        if "mmproj" in config:  # a GGUF: the mean/std its mmproj records, no square padding
            spec = ClipImageSpec.from_dict(config.get("preprocessing", {}), tile)
        else:
            spec = replace(ClipImageSpec.from_folder(path, tile), pad_to_square=False)
        return cls(spec, pinpoints, tile, int(vision.get("patch_size", 14)), token)

    def preprocess(self, image: Image.Image) -> AnyresPixels:
        pixels = _rgb(image)
        size = (int(pixels.shape[1]), int(pixels.shape[2]))
        target = best_resolution(size, self.pinpoints)
        fitted = fitted_size(size, target)
        padded = np.zeros((3, *target), dtype=np.uint8)  # black around the picture, centred
        top, left = (target[0] - fitted[0]) // 2, (target[1] - fitted[1]) // 2
        padded[:, top : top + fitted[0], left : left + fitted[1]] = _resize(
            pixels, fitted, self.spec.resample
        )
        crop = self.spec.crop[0]
        tiles = [
            padded[:, i : i + crop, j : j + crop]
            for i in range(0, target[0], crop)
            for j in range(0, target[1], crop)
        ]
        base = _resize(pixels, (self.spec.shortest_edge, self.spec.shortest_edge), self.spec.resample)
        out = [preprocess_clip(Image.fromarray(np.moveaxis(t, 0, -1)), self.spec) for t in [base, *tiles]]
        return AnyresPixels(np.stack(out), size)

    def tokens_per_image(self, size: tuple[int, int]) -> int:
        """The whole picture's patch grid, then the unpadded tile grid with one newline row per row."""
        grid = self.tile // self.patch
        target = best_resolution(size, self.pinpoints)
        rows, columns = target[0] // self.tile * grid, target[1] // self.tile * grid
        top, bottom, left, right = unpadded_bounds(size, (rows, columns))
        return grid * grid + (bottom - top) * (right - left + 1)

    def grid(self, pixels: AnyresPixels) -> int:
        """The picture's number of image tokens (what request_images asks each picture for)."""
        return self.tokens_per_image(pixels.image_size)

    def expand(self, prompt_text: str, counts: list[int]) -> str:
        """Each `<image>`, in order, becomes its picture's run of image tokens; ValueError when the rendered
        prompt places a different number of pictures."""
        parts = prompt_text.split(IMAGE)
        if len(parts) - 1 != len(counts):
            raise ValueError(
                f"the rendered prompt has {len(parts) - 1} image slots for {len(counts)} images "
                "(does the model's chat template place images?)"
            )
        return parts[0] + "".join(IMAGE * n + rest for n, rest in zip(counts, parts[1:], strict=True))

    def placeholders(self, token_ids: list[int], counts: list[int]) -> list[tuple[int, ...]]:
        """Positions of each picture's image tokens, in order; ValueError when they do not add up."""
        positions = [i for i, t in enumerate(token_ids) if t == self.image_token_id]
        if len(positions) != sum(counts):
            raise ValueError(
                f"the prompt has {len(positions)} image tokens where its images need {sum(counts)}"
            )
        runs, at = [], 0
        for n in counts:
            run = tuple(positions[at : at + n])
            if run[-1] - run[0] != n - 1:
                raise ValueError(f"an image needs {n} consecutive image tokens in the prompt")
            runs.append(run)
            at += n
        return runs
