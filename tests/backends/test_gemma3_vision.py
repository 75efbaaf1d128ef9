"""Gemma 3's vision tower + projector (localchat.backends.torch.vision.gemma3) against transformers on a
tiny random Gemma3ForConditionalGeneration saved as a safetensors folder, fp32: real PNG files go through
localchat's preprocessing, and the image embeddings match get_image_features; different pictures give
different embeddings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import Gemma3Config, Gemma3ForConditionalGeneration

from localchat.backends.torch.vision.gemma3 import load_gemma3_vision
from localchat.vision.gemma3_preprocess import ImageSpec, decode, preprocess
from tests.backends.test_gemma3_multimodal import TEXT

VISION = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "image_size": 56,
    "patch_size": 14,
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Path]:
    torch.manual_seed(0)
    config = Gemma3Config(
        text_config=TEXT, vision_config=VISION, mm_tokens_per_image=4, image_token_index=299
    )
    hf = Gemma3ForConditionalGeneration(config)
    with torch.no_grad():
        for name, param in hf.named_parameters():
            param.copy_((0.3 if name.endswith("norm.weight") else 0.15) * torch.randn_like(param))
    folder = tmp_path_factory.mktemp("gemma3v")
    hf.eval().save_pretrained(folder)
    return hf, folder


def _pictures(folder: Path) -> list[bytes]:
    rng = np.random.default_rng(1)
    out = []
    for i, shape in enumerate(((40, 70, 3), (90, 33, 3))):
        path = folder / f"p{i}.png"
        Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), "RGB").save(path)
        out.append(path.read_bytes())
    return out


def test_image_embeddings_match_transformers(saved: tuple[torch.nn.Module, Path], tmp_path: Path) -> None:
    hf, folder = saved
    vision = load_gemma3_vision(folder)
    spec = ImageSpec.from_folder(folder, vision.image_size)
    pixels = torch.from_numpy(np.stack([preprocess(decode(b), spec) for b in _pictures(tmp_path)]))
    ours = vision.encode(pixels)
    with torch.no_grad():
        theirs = hf.model.get_image_features(pixel_values=pixels).pooler_output
    assert ours.shape == (2, 4, TEXT["hidden_size"])
    err = (ours - theirs).abs().max().item()
    print(f"gemma3 vision max abs err fp32: {err:.2e}")
    assert err < 1e-4
    assert (ours[0] - ours[1]).abs().max().item() > 1e-2  # different pictures, different embeddings
