"""localchat's Gemma 3 image preprocessing gives the same pixel values, bit for bit, as transformers'
Gemma3ImageProcessor on real PNG and JPEG files (RGB, RGBA with transparency, greyscale, odd sizes)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from transformers.models.gemma3 import Gemma3ImageProcessorPil

from localchat.vision.gemma3_preprocess import ImageSpec, content_hash, decode, preprocess


def _files(folder: Path) -> list[Path]:
    rng = np.random.default_rng(0)
    rgb = Image.fromarray(rng.integers(0, 256, (37, 53, 3), dtype=np.uint8), "RGB")
    rgba = Image.fromarray(rng.integers(0, 256, (64, 20, 4), dtype=np.uint8), "RGBA")
    grey = Image.fromarray(rng.integers(0, 256, (90, 90), dtype=np.uint8), "L")
    paths = []
    for name, image in (("rgb.png", rgb), ("rgba.png", rgba), ("grey.png", grey), ("photo.jpg", rgb)):
        path = folder / name
        image.save(path)
        paths.append(path)
    return paths


@pytest.mark.parametrize("size", [28, 224])
def test_pixels_match_transformers_bit_for_bit(tmp_path: Path, size: int) -> None:
    reference = Gemma3ImageProcessorPil(size={"height": size, "width": size})
    spec = ImageSpec(size=size)
    for path in _files(tmp_path):
        data = path.read_bytes()
        ours = preprocess(decode(data), spec)
        theirs = reference(images=Image.open(path), return_tensors="np")["pixel_values"][0]
        assert ours.dtype == np.float32 and ours.shape == (3, size, size)
        assert np.array_equal(ours, theirs), path.name


def test_bad_bytes_refused_and_hash_tells_pictures_apart(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a readable image"):
        decode(b"not an image")
    a, b = (p.read_bytes() for p in _files(tmp_path)[:2])
    assert content_hash(a) != content_hash(b) and content_hash(a) == content_hash(bytes(a))
