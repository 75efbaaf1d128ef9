"""The server's side of a SmolVLM / Idefics3 image prompt, without torch: the chat template writes
`<image>` per picture; as transformers' SmolVLMProcessor / Idefics3Processor do, each becomes, for a
picture cut into rows x cols tiles, `<fake_token_around_image><row_r_col_c>` + the tile's image tokens per
tile (a newline after each row), then "\\n<fake_token_around_image><global-img>" + the global image's tokens +
`<fake_token_around_image>` (only that last part for a one-tile picture). After tokenizing, each picture
is paired with all its image tokens, in tile order: row markers sit between the tiles, so the run is not
contiguous."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from localchat.engine.request import ImageInput
from localchat.vision.smolvlm_preprocess import SmolVLMImageSpec, preprocess_smolvlm

IMAGE = "<image>"
FAKE = "<fake_token_around_image>"
GLOBAL = "<global-img>"
SMOLVLM_TYPES = frozenset({"smolvlm", "idefics3"})
# transformers' SmolVLMVisionConfig / Idefics3VisionConfig defaults: SmolVLM2's config.json leaves some out.
VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 1152,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 16,
    "image_size": 224,
    "patch_size": 32,
    "layer_norm_eps": 1e-6,
    "hidden_act": "gelu_pytorch_tanh",
}


def vision_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The tower's settings: config.json's vision_config over transformers' defaults."""
    return {**VISION_DEFAULTS, **(config.get("vision_config") or {})}


def tokens_per_tile(config: dict[str, Any]) -> int:
    """Image tokens per tile: the tower's patch grid after the connector's pixel shuffle."""
    vision = vision_settings(config)
    grid = int(vision["image_size"]) // int(vision["patch_size"])
    return grid * grid // int(config.get("scale_factor", 2)) ** 2


def image_text(rows: int, cols: int, per_tile: int) -> str:
    """The processor's replacement for one picture's `<image>`."""
    run = IMAGE * per_tile
    tiles = "".join(
        "".join(f"{FAKE}<row_{r + 1}_col_{c + 1}>{run}" for c in range(cols)) + "\n" for r in range(rows)
    )
    global_image = f"{FAKE}{GLOBAL}{run}{FAKE}"
    return f"{tiles}\n{global_image}" if rows or cols else global_image


@dataclass(frozen=True, slots=True)
class SmolVLMImagePrompt:
    spec: SmolVLMImageSpec
    image_token_id: int
    per_tile: int

    @classmethod
    def from_config(cls, path: Path, config: dict[str, Any]) -> SmolVLMImagePrompt:
        """`path`: the folder (its preprocessor_config.json), or a GGUF whose config came from its mmproj."""
        tile = int(vision_settings(config)["image_size"])
        if "mmproj" in config:  # a GGUF: the sizes and mean/std its projector file records
            spec = SmolVLMImageSpec.from_dict(config.get("preprocessing", {}), tile)
        else:
            spec = SmolVLMImageSpec.from_folder(path, tile)
        token = int(config.get("image_token_id", config.get("image_token_index", 128_257)))
        return cls(spec, token, tokens_per_tile(config))

    def preprocess(self, image: Image.Image) -> tuple[np.ndarray, tuple[int, int]]:
        """(pixel values [tiles, 3, S, S], (rows, cols))."""
        return preprocess_smolvlm(image, self.spec)

    def expand(self, prompt_text: str, tiles: list[tuple[int, int]]) -> str:
        """Each `<image>` in turn -> its picture's tiles and global image; ValueError when the template
        wrote a different number of `<image>` than there are pictures."""
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
        positions of its image tokens; ValueError when the counts do not add up (a truncated prompt)."""
        positions = [i for i, t in enumerate(token_ids) if t == self.image_token_id]
        out = []
        start = 0
        for digest, pixels, (rows, cols) in pictures:
            n = (rows * cols + 1) * self.per_tile
            run = tuple(positions[start : start + n])
            if len(run) != n:
                raise ValueError(
                    f"an image split into {rows}x{cols} tiles needs {n} image tokens in the prompt"
                )
            out.append(ImageInput(run, digest, pixels))
            start += n
        if start != len(positions):
            raise ValueError(f"the prompt has {len(positions)} image tokens for {start} in its pictures")
        return tuple(out)
