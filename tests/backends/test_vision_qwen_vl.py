"""Qwen2.5-VL and Qwen3-VL image input (#29) against transformers on tiny random checkpoints, fp32: the
preprocessing equals transformers' Qwen2VLImageProcessorPil bit for bit on real PNG/JPEG files, and the
vision towers' outputs (with Qwen3-VL's DeepStack features) equal get_image_features."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from localchat.backends.torch.vision.qwen_vl import encode_image, load_qwen_vision
from localchat.vision.qwen_vl_preprocess import QwenImageSpec, preprocess_qwen, smart_resize
from tests.helpers import qwen_vl_models as tiny

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=tiny.KINDS)
def saved(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Any, Path]:
    folder = tmp_path_factory.mktemp(request.param)
    return request.param, tiny.write_folder(request.param, folder), folder


def test_smart_resize_bounds() -> None:
    assert smart_resize(70, 100, 28, 56 * 56, 120 * 120) == (56, 112)  # round half to even, as the processor
    h, w = smart_resize(1000, 3000, 28, 56 * 56, 28 * 28 * 100)
    assert h % 28 == w % 28 == 0 and h * w <= 28 * 28 * 100
    with pytest.raises(ValueError, match="aspect ratio"):
        smart_resize(2, 1000, 28, 56 * 56, 120 * 120)


def test_preprocessing_equals_transformers(saved: tuple[str, Any, Path], tmp_path: Path) -> None:
    kind, _, folder = saved
    config = __import__("json").loads((folder / "config.json").read_text())
    spec = QwenImageSpec.from_folder(folder, config["vision_config"])
    extra = tmp_path / "rgba.png"  # transparency composited on white, as the processor does
    Image.fromarray(np.random.default_rng(2).integers(0, 256, (60, 61, 4), dtype=np.uint8), "RGBA").save(
        extra
    )
    for path in [*tiny.pictures(tmp_path), extra]:
        ours, grid = preprocess_qwen(Image.open(path), spec)
        theirs = tiny.image_processor(kind)(Image.open(path), return_tensors="np")
        assert grid == tuple(theirs["image_grid_thw"][0])
        assert np.array_equal(ours, theirs["pixel_values"]), path.name  # bit for bit


def test_tower_equals_get_image_features(saved: tuple[str, Any, Path], tmp_path: Path) -> None:
    kind, hf, folder = saved
    tower = load_qwen_vision(folder)
    outs = []
    for path in tiny.pictures(tmp_path):
        ref = tiny.image_processor(kind)(Image.open(path), return_tensors="pt")
        grid = tuple(int(g) for g in ref["image_grid_thw"][0])
        with torch.no_grad():
            ours = encode_image(tower, ref["pixel_values"].numpy(), grid)  # type: ignore[arg-type]
            theirs = hf.model.get_image_features(
                pixel_values=ref["pixel_values"], image_grid_thw=ref["image_grid_thw"]
            )
        main = theirs.pooler_output
        main = torch.cat(list(main)) if isinstance(main, (list, tuple)) else main
        stacked = [torch.cat(list(f)) if isinstance(f, (list, tuple)) else f for f in _deepstack(theirs)]
        blocks = [main, *stacked]
        expected = torch.cat(blocks, dim=-1)
        assert ours.shape == expected.shape == (grid[1] * grid[2] // 4, 64 * tower.stacked)
        err = (ours - expected).abs().max().item()
        print(f"{kind} tower max abs err fp32 ({grid}): {err:.2e}")
        assert err < 1e-5
        outs.append(ours)
    assert tower.stacked == (3 if kind == "qwen3_vl" else 1)
    same = outs[0].shape == outs[1].shape and (outs[0] - outs[1]).abs().max().item() < 1e-2
    assert not same  # different pictures, different embeddings


def _deepstack(output: object) -> list[Any]:
    features = getattr(output, "deepstack_features", None)
    return list(features) if features else []
