"""The server's side of a Pixtral image prompt (Mistral3ForConditionalGeneration folders: Mistral Small
3.1 / 3.2), without torch: the chat template writes `[IMG]` per picture; as PixtralProcessor does, each
becomes the picture's token grid, row by row: one `[IMG]` per merged patch of the row, then
`[IMG_BREAK]`, with the last row's break replaced by `[IMG_END]`. Only the `[IMG]` positions take image
embeddings (the breaks and the end keep their text embeddings), so after tokenizing each picture is
paired with its rows x columns `[IMG]` tokens, in order."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from localchat.vision.pixtral_preprocess import PixtralImageSpec, preprocess_pixtral

PIXTRAL_TYPES = frozenset({"mistral3"})


@dataclass(frozen=True, slots=True)
class PixtralImagePrompt:
    spec: PixtralImageSpec
    image_token_id: int
    image: str = "[IMG]"
    image_break: str = "[IMG_BREAK]"
    image_end: str = "[IMG_END]"

    @classmethod
    def from_config(cls, folder: Path, config: dict[str, Any]) -> PixtralImagePrompt:
        """`folder`: the model folder, or a GGUF whose config came from its mmproj (the mean/std and
        longest edge it records)."""
        vision = config["vision_config"]
        unit = int(vision.get("patch_size", 14)) * int(config.get("spatial_merge_size", 2))
        longest_edge = int(vision.get("image_size", 1540))
        if "mmproj" in config:
            spec = PixtralImageSpec.from_dict(config.get("preprocessing", {}), unit, longest_edge)
        else:
            spec = PixtralImageSpec.from_folder(folder, unit, longest_edge)
        names_file = folder / "processor_config.json"
        names = json.loads(names_file.read_text()) if names_file.is_file() else {}
        token = int(config.get("image_token_index", config.get("image_token_id", 10)))
        return cls(
            spec,
            token,
            str(names.get("image_token", "[IMG]")),
            str(names.get("image_break_token", "[IMG_BREAK]")),
            str(names.get("image_end_token", "[IMG_END]")),
        )

    def preprocess(self, image: Image.Image) -> np.ndarray:
        return preprocess_pixtral(image, self.spec)

    def grid(self, pixels: np.ndarray) -> tuple[int, int]:
        """(rows, columns) of a preprocessed picture's merged tokens."""
        return pixels.shape[-2] // self.spec.unit, pixels.shape[-1] // self.spec.unit

    def tokens(self, rows: int, columns: int) -> str:
        """One picture's run of image tokens, as PixtralProcessor writes it."""
        row = self.image * columns + self.image_break
        return (row * rows)[: -len(self.image_break)] + self.image_end

    def expand(self, prompt_text: str, grids: list[tuple[int, int]]) -> str:
        """Each picture's `[IMG]`, in order, becomes its grid of tokens; ValueError when the rendered
        prompt places a different number of pictures."""
        parts = prompt_text.split(self.image)
        if len(parts) - 1 != len(grids):
            raise ValueError(
                f"the rendered prompt has {len(parts) - 1} image slots for {len(grids)} images "
                "(does the model's chat template place images?)"
            )
        return parts[0] + "".join(
            self.tokens(*grid) + rest for grid, rest in zip(grids, parts[1:], strict=True)
        )

    def placeholders(self, token_ids: list[int], grids: list[tuple[int, int]]) -> list[tuple[int, ...]]:
        """Positions of each picture's `[IMG]` tokens, in order; ValueError when they do not add up."""
        positions = [i for i, t in enumerate(token_ids) if t == self.image_token_id]
        wanted = sum(rows * columns for rows, columns in grids)
        if len(positions) != wanted:
            raise ValueError(f"the prompt has {len(positions)} image tokens where its images need {wanted}")
        runs, at = [], 0
        for rows, columns in grids:
            run = tuple(positions[at : at + rows * columns])
            # a picture's tokens lie within its own run: its rows, each followed by one break/end token
            if run[-1] - run[0] != rows * (columns + 1) - 2:
                raise ValueError(f"an image needs its {rows} rows of {columns} image tokens together")
            runs.append(run)
            at += rows * columns
        return runs
