"""The server's side of a Qwen2.5-VL / Qwen3-VL image prompt, without torch: the chat template writes
`<|vision_start|><|image_pad|><|vision_end|>` per picture; as transformers' processor does, each
`<|image_pad|>` becomes one pad per merged token of that picture (its grid rows x columns / merge^2), and
after tokenizing each picture is paired with its run of pads and its merged grid (for M-RoPE)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from localchat.engine.request import ImageInput
from localchat.vision.qwen_vl_preprocess import QwenImageSpec, preprocess_qwen

IMAGE_PAD = "<|image_pad|>"
# Qwen3.5 (and its MoE) carry Qwen3-VL's tower without DeepStack.
QWEN_VL_TYPES = frozenset({"qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5", "qwen3_5_moe"})


@dataclass(frozen=True, slots=True)
class QwenImagePrompt:
    spec: QwenImageSpec
    image_token_id: int

    @classmethod
    def from_config(cls, folder: Path, config: dict[str, Any]) -> QwenImagePrompt:
        spec = QwenImageSpec.from_folder(folder, config["vision_config"])
        if "preprocessing" in config:  # a GGUF + mmproj pair: the file's mean/std, llama.cpp's pixel bounds
            spec = replace(spec, **config["preprocessing"])
        return cls(spec, int(config.get("image_token_id", 151_655)))

    def preprocess(self, image: Image.Image) -> tuple[np.ndarray, tuple[int, int, int]]:
        """Pixels [patches, C*T*P*P] and the merged token grid (frames, rows, columns)."""
        pixels, (t, h, w) = preprocess_qwen(image, self.spec)
        m = self.spec.merge_size
        return pixels, (t, h // m, w // m)

    def expand(self, prompt_text: str, grids: list[tuple[int, int, int]]) -> str:
        """Each picture's `<|image_pad|>`, in order, repeated once per merged token."""
        parts = prompt_text.split(IMAGE_PAD)
        if len(parts) - 1 != len(grids):
            raise ValueError(f"the rendered prompt has {len(parts) - 1} image slots for {len(grids)} images")
        out = [parts[0]]
        for grid, rest in zip(grids, parts[1:], strict=True):
            out.append(IMAGE_PAD * (grid[0] * grid[1] * grid[2]) + rest)
        return "".join(out)

    def inputs(
        self, token_ids: list[int], pictures: list[tuple[str, np.ndarray, tuple[int, int, int]]]
    ) -> tuple[ImageInput, ...]:
        """(content hash, pixels, grid) per picture in prompt order -> engine inputs with their pad runs."""
        positions = [i for i, t in enumerate(token_ids) if t == self.image_token_id]
        images, at = [], 0
        for digest, pixels, grid in pictures:
            count = grid[0] * grid[1] * grid[2]
            run = tuple(positions[at : at + count])
            if len(run) != count or run[-1] - run[0] != count - 1:
                raise ValueError(f"an image needs {count} consecutive image tokens in the prompt")
            images.append(ImageInput(run, digest, pixels, grid))
            at += count
        if at != len(positions):
            raise ValueError(f"the prompt has {len(positions) - at} image tokens no picture fills")
        return tuple(images)
