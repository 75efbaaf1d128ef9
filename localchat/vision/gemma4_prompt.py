"""Gemma 4's image tokens in a rendered prompt, as transformers' Gemma4Processor writes them: the chat
template writes the image token (`<|image|>`) once per picture, and each becomes begin-of-image + one image
token per soft token of that picture + end-of-image. A picture's soft token count follows its shape
(gemma4_preprocess.py), so the expansion is per picture; after tokenizing, each picture is paired with its
run of image tokens, where the runner scatters its embedding rows."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from localchat.vision.gemma4_preprocess import Gemma4ImageSpec, preprocess

GEMMA4_TYPES = frozenset({"gemma4"})
# transformers' Gemma4Config ids, and the token strings of Gemma 4's tokenizer for them.
_DEFAULTS = {"image_token_id": (258_880, "<|image|>"), "boi_token_id": (255_999, "<|image>")}
_DEFAULTS |= {"eoi_token_id": (258_882, "<image|>")}


def _token_strings(folder: Path, ids: dict[str, int]) -> dict[str, str]:
    """The strings of the image, begin and end tokens, looked up by id in tokenizer.json's added tokens
    (the processor takes them from the tokenizer); Gemma 4's own strings when the file lacks one."""
    by_id: dict[int, str] = {}
    path = folder / "tokenizer.json"
    if path.is_file():
        added = json.loads(path.read_text()).get("added_tokens") or []
        by_id = {int(t["id"]): str(t["content"]) for t in added if isinstance(t, dict) and "id" in t}
    return {key: by_id.get(ids[key], default) for key, (_, default) in _DEFAULTS.items()}


@dataclass(frozen=True, slots=True)
class Gemma4ImagePrompt:
    spec: Gemma4ImageSpec
    image_token_id: int
    image: str = "<|image|>"
    begin: str = "<|image>"
    end: str = "<image|>"

    @classmethod
    def from_config(cls, folder: Path, config: dict[str, Any]) -> Gemma4ImagePrompt:
        ids = {key: int(config.get(key) or default) for key, (default, _) in _DEFAULTS.items()}
        names = _token_strings(folder, ids)
        spec = Gemma4ImageSpec.from_folder(folder, config["vision_config"])
        return cls(
            spec, ids["image_token_id"], names["image_token_id"], names["boi_token_id"], names["eoi_token_id"]
        )

    def preprocess(self, image: Image.Image) -> np.ndarray:
        return preprocess(image, self.spec)

    def grid(self, pixels: np.ndarray) -> tuple[int, int]:
        """(rows, columns) of a preprocessed picture's soft tokens (its patch grid over the pooling kernel)."""
        unit = self.spec.patch_size * self.spec.pooling_kernel_size
        return pixels.shape[-2] // unit, pixels.shape[-1] // unit

    def expand(self, prompt_text: str, grids: list[tuple[int, int]]) -> str:
        """Each picture's image token, in order, becomes its full run; ValueError when the rendered prompt
        places a different number of pictures."""
        parts = prompt_text.split(self.image)
        if len(parts) - 1 != len(grids):
            raise ValueError(
                f"the rendered prompt has {len(parts) - 1} image slots for {len(grids)} images "
                "(does the model's chat template place images?)"
            )
        runs = [f"{self.begin}{self.image * (rows * columns)}{self.end}" for rows, columns in grids]
        return parts[0] + "".join(run + rest for run, rest in zip(runs, parts[1:], strict=True))

    def placeholders(self, token_ids: list[int], grids: list[tuple[int, int]]) -> list[tuple[int, ...]]:
        """Positions of each picture's image tokens, in order; ValueError when a run is broken or the
        counts do not add up (a prompt that truncation or a template broke)."""
        positions = [i for i, t in enumerate(token_ids) if t == self.image_token_id]
        sizes = [rows * columns for rows, columns in grids]
        if len(positions) != sum(sizes):
            raise ValueError(
                f"the prompt has {len(positions)} image tokens where its images need {sum(sizes)}"
            )
        runs, at = [], 0
        for size in sizes:
            run = tuple(positions[at : at + size])
            if run[-1] - run[0] != size - 1:
                raise ValueError(f"an image needs {size} consecutive image tokens in the prompt")
            runs.append(run)
            at += size
        return runs
