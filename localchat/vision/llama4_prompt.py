"""The server's side of a Llama 4 image prompt, without torch: the chat template writes `<|image|>` per
picture; as transformers' Llama4Processor does, each becomes `<|image_start|>`, then for a picture cut into
more than one tile each tile's `<|patch|>` run (`<|tile_x_separator|>` between the tiles of a row,
`<|tile_y_separator|>` after each row), then `<|image|>` and the global image's `<|patch|>` run, then
`<|image_end|>`. The model writes the picture's rows over the `<|patch|>` tokens, in that order."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from localchat.engine.request import ImageInput
from localchat.vision.llama4_preprocess import Llama4ImageSpec, preprocess_llama4

IMAGE = "<|image|>"
PATCH = "<|patch|>"
LLAMA4_TYPES = frozenset({"llama4"})
PATCH_TOKEN_ID = 200_092  # Llama 4's <|patch|>, config.json's image_token_index


def tokens_per_tile(config: dict[str, Any]) -> int:
    """Image tokens per tile: the tower's patch grid after the adapter's pixel shuffle."""
    vision = config.get("vision_config") or {}
    grid = int(vision.get("image_size", 448)) // int(vision.get("patch_size", 14))
    return round(grid * grid * float(vision.get("pixel_shuffle_ratio", 0.5)) ** 2)


def image_text(rows: int, cols: int, per_tile: int) -> str:
    """The processor's replacement for one picture's `<|image|>`."""
    run = PATCH * per_tile
    tiles = ""
    if rows * cols > 1:
        tiles = "".join(
            "<|tile_x_separator|>".join([run] * cols) + "<|tile_y_separator|>" for _ in range(rows)
        )
    return f"<|image_start|>{tiles}{IMAGE}{run}<|image_end|>"


@dataclass(frozen=True, slots=True)
class Llama4ImagePrompt:
    spec: Llama4ImageSpec
    patch_token_id: int
    per_tile: int

    @classmethod
    def from_config(cls, path: Path, config: dict[str, Any]) -> Llama4ImagePrompt:
        token = int(config.get("image_token_index", config.get("image_token_id", PATCH_TOKEN_ID)))
        if "preprocessing" in config:  # a GGUF + mmproj pair: the file's tile size and mean/std
            spec = Llama4ImageSpec.from_dict(config["preprocessing"])
        else:
            spec = Llama4ImageSpec.from_folder(path)
        return cls(spec, token, tokens_per_tile(config))

    def preprocess(self, image: Image.Image) -> tuple[np.ndarray, tuple[int, int]]:
        """(pixel values [tiles, 3, S, S], (rows, cols))."""
        return preprocess_llama4(image, self.spec)

    def expand(self, prompt_text: str, tiles: list[tuple[int, int]]) -> str:
        """Each `<|image|>` in turn -> its picture's tokens; ValueError when the template wrote a different
        number of `<|image|>` than there are pictures."""
        parts = prompt_text.split(IMAGE)
        if len(parts) - 1 != len(tiles):
            raise ValueError(f"the rendered prompt has {len(parts) - 1} image slots for {len(tiles)} images")
        out = [parts[0]]
        for (rows, cols), rest in zip(tiles, parts[1:], strict=True):
            out += [image_text(rows, cols, self.per_tile), rest]
        return "".join(out)

    def inputs(
        self, token_ids: list[int], pictures: list[tuple[str, np.ndarray, tuple[int, int]]]
    ) -> tuple[ImageInput, ...]:
        """(content hash, pixels, (rows, cols)) per picture in prompt order -> engine inputs, each with the
        positions of its `<|patch|>` tokens; ValueError when the counts do not add up (a truncated prompt)."""
        positions = [i for i, t in enumerate(token_ids) if t == self.patch_token_id]
        out = []
        start = 0
        for digest, pixels, (rows, cols) in pictures:
            n = (rows * cols + (1 if rows * cols > 1 else 0)) * self.per_tile
            run = tuple(positions[start : start + n])
            if len(run) != n:
                raise ValueError(
                    f"an image cut into {rows}x{cols} tiles needs {n} patch tokens in the prompt"
                )
            out.append(ImageInput(run, digest, pixels))
            start += n
        if start != len(positions):
            raise ValueError(f"the prompt has {len(positions)} patch tokens for {start} in its pictures")
        return tuple(out)
