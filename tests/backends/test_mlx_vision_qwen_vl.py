"""Qwen2.5-VL, Qwen3-VL and Qwen3.5 image input on MLX (#29), float32 on MLX's CPU device, against
transformers on the torch suite's tiny random checkpoints (tests/helpers/qwen_vl_models.py): the towers'
outputs (DeepStack rows included) equal get_image_features, and through LLMEngine + the MLX runner (M-RoPE
positions, the scatter, a prefill chunk boundary inside the image run) the greedy tokens equal
transformers'."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
torch = pytest.importorskip("torch")

from PIL import Image  # noqa: E402

from localchat.backends.mlx.vision.qwen_vl import load_qwen_vision  # noqa: E402
from localchat.vision.gemma3_preprocess import content_hash  # noqa: E402
from localchat.vision.qwen_vl_prompt import QwenImagePrompt  # noqa: E402
from localchat.weights.loader import load_model  # noqa: E402
from tests.backends.test_vision_qwen_vl import _hf_greedy  # noqa: E402
from tests.helpers import qwen_vl_models as tiny  # noqa: E402
from tests.helpers.parity import mlx_runner  # noqa: E402
from tests.helpers.picture_parity import greedy_request, small_engine  # noqa: E402

pytestmark = pytest.mark.mlx


@pytest.fixture(scope="module", params=tiny.KINDS)
def saved(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Any, Path]:
    folder = tmp_path_factory.mktemp(f"mlx-{request.param}")
    return request.param, tiny.write_folder(request.param, folder), folder


def test_tower_equals_get_image_features(saved: tuple[str, Any, Path], tmp_path: Path) -> None:
    kind, hf, folder = saved
    tower = load_qwen_vision(folder)
    assert tower is not None
    for path in tiny.pictures(tmp_path):
        ref = tiny.image_processor(kind)(Image.open(path), return_tensors="pt")
        grid = tuple(int(g) for g in ref["image_grid_thw"][0])
        ours = np.array(tower.encode(mx.array(ref["pixel_values"].numpy()), grid))  # type: ignore[arg-type]
        with torch.no_grad():
            theirs = hf.model.get_image_features(
                pixel_values=ref["pixel_values"], image_grid_thw=ref["image_grid_thw"]
            )
        blocks = [theirs.pooler_output, *(getattr(theirs, "deepstack_features", None) or [])]
        flat = [torch.cat(list(b)) if isinstance(b, (list, tuple)) else b for b in blocks]
        expected = torch.cat(flat, dim=-1).numpy()
        assert ours.shape == expected.shape
        err = float(np.abs(ours - expected).max())
        print(f"mlx {kind} tower max abs err fp32 ({grid}): {err:.2e}")
        assert err < 1e-4


@pytest.mark.parametrize("chunk", [0, 7])
def test_engine_greedy_equals_transformers(saved: tuple[str, Any, Path], tmp_path: Path, chunk: int) -> None:
    kind, hf, folder = saved
    prompt_side = QwenImagePrompt.from_config(folder, json.loads((folder / "config.json").read_text()))
    bundle = load_model(folder)
    engine = small_engine(mlx_runner(bundle), bundle.tokenizer, chunk, 128)
    answers = []
    for path in tiny.pictures(tmp_path):
        pixels, grid = prompt_side.preprocess(Image.open(path))
        count = grid[0] * grid[1] * grid[2]
        prompt = [1, 3, 5, tiny.START, *[tiny.IMAGE] * count, tiny.END, 7, 9, 2, 1, 4]
        images = prompt_side.inputs(prompt, [(content_hash(path.read_bytes()), pixels, grid)])
        ours, _ = greedy_request(engine, prompt, images, 5)
        ref = tiny.image_processor(kind)(Image.open(path), return_tensors="pt")
        assert ours == _hf_greedy(hf, prompt, ref, 5), path.name
        answers.append(ours)
    assert answers[0] != answers[1]
