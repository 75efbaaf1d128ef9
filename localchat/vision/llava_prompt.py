"""The server's side of a LLaVA image prompt (LlavaForConditionalGeneration folders, and a llama GGUF with
llama.cpp's `mlp` mmproj), without torch: the chat template writes `<image>` per picture; as transformers'
LlavaProcessor does, each becomes one `<image>` per patch the tower hands the language model (the patch
grid, plus the CLS row under the "full" feature strategy), and after tokenizing each picture is paired
with its run of image tokens."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from localchat.vision.clip_preprocess import ClipImageSpec, preprocess_clip

IMAGE = "<image>"
LLAVA_TYPES = frozenset({"llava"})


def image_tokens(config: dict[str, Any]) -> int:
    """Embedding rows per picture: one per patch, + CLS unless the "default" strategy drops it."""
    vision = config["vision_config"]
    grid = int(vision["image_size"]) // int(vision["patch_size"])
    full = config.get("vision_feature_select_strategy", "default") == "full"
    return grid * grid + (1 if full else 0)


@dataclass(frozen=True, slots=True)
class LlavaImagePrompt:
    spec: ClipImageSpec
    image_token_id: int
    tokens_per_image: int

    @classmethod
    def from_config(cls, path: Path, config: dict[str, Any]) -> LlavaImagePrompt:
        """`path`: the folder (its preprocessor_config.json), or a GGUF whose config came from its mmproj
        (the mean/std it records; pictures padded to a square first, as LLaVA 1.5 was trained)."""
        size = int(config["vision_config"]["image_size"])
        if "mmproj" in config:
            preprocessing = {"do_pad": True, **config.get("preprocessing", {})}
            spec = ClipImageSpec.from_dict(preprocessing, size)
        else:
            spec = ClipImageSpec.from_folder(path, size)
        token = int(config.get("image_token_index", config.get("image_token_id", 32_000)))
        return cls(spec, token, image_tokens(config))

    def preprocess(self, image: Image.Image) -> np.ndarray:
        return preprocess_clip(image, self.spec)

    def expand(self, prompt_text: str) -> str:
        """Every `<image>` -> the picture's full run of image tokens (the processor's string replacement)."""
        return prompt_text.replace(IMAGE, IMAGE * self.tokens_per_image)

    def placeholders(self, token_ids: list[int]) -> list[tuple[int, ...]]:
        """Positions of each picture's image tokens, in order; ValueError when a run is cut short."""
        positions = [i for i, t in enumerate(token_ids) if t == self.image_token_id]
        n = self.tokens_per_image
        runs = [tuple(positions[k : k + n]) for k in range(0, len(positions), n)]
        for run in runs:
            if len(run) != n or run[-1] - run[0] != n - 1:
                raise ValueError(f"an image needs {n} consecutive image tokens in the prompt")
        return runs
