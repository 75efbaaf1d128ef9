"""A tiny random LlavaNextForConditionalGeneration (transformers' own class: the LLaVA test model's Llama
text model and CLIP tower, 56-px tiles) saved as a safetensors folder with LLaVA-NeXT's preprocessor config
at the tiny tile size, for the LLaVA-NeXT parity and e2e tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from transformers import LlavaNextConfig, LlavaNextForConditionalGeneration

from tests.helpers.llava_models import IMAGE, IMAGE_SIZE, TEXT, VISION, write_tokenizer

TILE = IMAGE_SIZE
# LLaVA 1.6's grid (336-px tiles: 1x2, 2x1, 2x2, 3x1, 1x3) at the tiny tile size
PINPOINTS = [[TILE, 2 * TILE], [2 * TILE, TILE], [2 * TILE, 2 * TILE], [3 * TILE, TILE], [TILE, 3 * TILE]]
PREPROCESSOR = {
    "image_processor_type": "LlavaNextImageProcessor",
    "crop_size": {"height": TILE, "width": TILE},
    "do_center_crop": True,
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_pad": True,
    "do_rescale": True,
    "do_resize": True,
    "image_grid_pinpoints": PINPOINTS,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "resample": 3,
    "rescale_factor": 0.00392156862745098,
    "size": {"shortest_edge": TILE},
}


def build(**config: Any) -> LlavaNextForConditionalGeneration:
    torch.manual_seed(0)
    hf = LlavaNextForConditionalGeneration(
        LlavaNextConfig(
            text_config=TEXT,
            vision_config=VISION,
            image_token_index=IMAGE,
            image_grid_pinpoints=PINPOINTS,
            **config,
        )
    )
    with torch.no_grad():
        for name, param in hf.named_parameters():
            scale = 0.3 if "norm" in name else 0.15
            param.copy_(
                (1.0 if name.endswith(("norm.weight", "layrnorm.weight")) else 0.0)
                + scale * torch.randn_like(param)
            )
    return hf.eval()


def write_folder(folder: Path, **config: Any) -> LlavaNextForConditionalGeneration:
    hf = build(**config)
    hf.save_pretrained(folder)
    write_tokenizer(folder)
    (folder / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))
    return hf


def pictures(folder: Path) -> list[Path]:
    """Real files of several aspect ratios: wide (2 tiles across), tall, near-square, very wide (3 across)."""
    rng = np.random.default_rng(3)
    out = []
    for name, shape in (
        ("wide.png", (40, 90)),
        ("tall.jpg", (130, 61)),
        ("square.png", (77, 70)),
        ("strip.jpg", (30, 150)),
    ):
        path = folder / name
        Image.fromarray(rng.integers(0, 256, (*shape, 3), dtype=np.uint8), "RGB").save(path)
        out.append(path)
    return out
