"""Gemma 4's vision tower + embedder on MLX (localchat.backends.mlx.vision.gemma4) and the MLX runner's
image path against transformers, on the tiny random Gemma4ForConditionalGeneration of the torch suite
(tests/backends/test_gemma4_vision.py: clipped linears, standardized features), float32 on MLX's CPU
device: real picture files through localchat's preprocessing; the image embeddings match
get_image_features; an image prompt through the runner's execute path (image slices as the engine builds
them, whole or chunked), with and without per-layer embeddings and with `use_bidirectional_attention:
"vision"` (the picture sees itself both ways on sliding layers; chunks never cut it), gives transformers'
logits and greedy tokens (mm_token_type_ids as the processor passes them), and the picture is encoded
once (the encoder cache)."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
torch = pytest.importorskip("torch")

from localchat.backends.mlx.vision.gemma4 import load_gemma4_vision  # noqa: E402
from localchat.engine.request import ImageInput  # noqa: E402
from localchat.vision.gemma3_preprocess import content_hash, decode  # noqa: E402
from localchat.vision.gemma4_preprocess import Gemma4ImageSpec, preprocess  # noqa: E402
from localchat.vision.model_info import vision_config  # noqa: E402
from localchat.weights.loader import load_model  # noqa: E402
from tests.backends.test_gemma4_vision import FOLDERS  # noqa: E402
from tests.helpers import picture_parity as picture  # noqa: E402
from tests.helpers.gemma4_gguf_vision import write_gguf_pair  # noqa: E402
from tests.helpers.gemma4_vision_models import (  # noqa: E402
    IMAGE_SPECIALS,
    image_processor,
    pictures,
    write_folder,
)
from tests.helpers.parity import Driver, mlx_runner  # noqa: E402
from tests.helpers.picture_prefill import scheduler_chunks  # noqa: E402

pytestmark = pytest.mark.mlx

IMAGE = IMAGE_SPECIALS["<|image|>"]


@pytest.fixture(scope="module", params=list(FOLDERS))
def saved(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    folder = tmp_path_factory.mktemp(f"gemma4v-mlx-{request.param}")
    return write_folder(folder, FOLDERS[request.param]), folder


def _pixels(folder: Path, path: Path) -> np.ndarray:
    spec = Gemma4ImageSpec.from_folder(folder, vision_config(folder)["vision_config"])  # type: ignore[index]
    return preprocess(decode(path.read_bytes()), spec)


def _reference(path: Path) -> dict[str, Any]:
    return dict(image_processor()(decode(path.read_bytes()), return_tensors="pt"))


def test_image_embeddings_match_transformers(saved: tuple[Any, Path], tmp_path: Path) -> None:
    hf, folder = saved
    vision = load_gemma4_vision(folder)
    assert vision is not None
    for path in pictures(tmp_path):
        ref = _reference(path)
        ours = np.array(vision.encode(mx.array(_pixels(folder, path))[None])[0])
        with torch.no_grad():
            theirs = hf.model.get_image_features(
                pixel_values=ref["pixel_values"], image_position_ids=ref["image_position_ids"]
            ).pooler_output[0]
        assert ours.shape == tuple(theirs.shape)
        err = np.abs(ours - theirs.numpy()).max()
        print(f"mlx gemma4 vision max abs err fp32: {err:.2e}")
        assert err < 1e-4


def _hf_logits(hf: Any, tokens: list[int], ref: dict[str, Any]) -> np.ndarray:
    # mm_token_type_ids as Gemma4Processor gives them: with "vision", the picture sees itself both ways
    ids = torch.tensor([tokens])
    with torch.no_grad():
        out = hf(
            input_ids=ids,
            pixel_values=ref["pixel_values"],
            image_position_ids=ref["image_position_ids"],
            mm_token_type_ids=(ids == IMAGE).long(),
        )
    return np.asarray(out.logits[0].float().numpy())


@pytest.mark.parametrize("chunk", [None, 9])
def test_image_prompt_logits_and_greedy_tokens_match(
    saved: tuple[Any, Path], tmp_path: Path, chunk: int | None
) -> None:
    hf, folder = saved
    path = pictures(tmp_path)[1]  # the wide JPEG
    ref = _reference(path)
    pixels = _pixels(folder, path)
    count = int(ref["num_soft_tokens_per_image"][0])
    prompt = [2, 5, 17, IMAGE_SPECIALS["<|image>"], *[IMAGE] * count, IMAGE_SPECIALS["<image|>"], 42, 7]
    runner = mlx_runner(load_model(folder))
    assert runner.images is not None
    image = ImageInput(
        tuple(i for i, t in enumerate(prompt) if t == IMAGE), content_hash(path.read_bytes()), pixels
    )
    driver = Driver(runner)
    both_ways = hf.config.get_text_config().use_bidirectional_attention == "vision"
    assert runner.pictures_both_ways == both_ways
    if chunk is None or not both_ways:  # causal checkpoints: a chunk may end inside the picture
        steps = picture.spans(len(prompt), chunk)
    else:  # "vision": the scheduler's chunks, never inside the picture
        steps = scheduler_chunks(len(prompt), image, chunk)
    picture.assert_prefill_and_greedy(
        driver,
        prompt,
        steps,
        picture.image_slices(driver, image, only_with_rows=True),
        partial(_hf_logits, hf, ref=ref),
        "mlx gemma4",
        # The image rows carry the tower's ~1e-5 float error through every layer of a random model (a
        # text-only prompt here is at ~6e-6), so the bound is looser than the text suites' 1e-4.
        atol=3e-4,
    )
    picture.assert_encoded_once(runner, image, steps)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path, Path]:
    return write_gguf_pair(tmp_path_factory.mktemp("gemma4v-src"), tmp_path_factory.mktemp("gemma4v-gguf"))


def test_a_gguf_with_its_gemma4v_mmproj_runs_the_tower_on_mlx(
    pair: tuple[Any, Path, Path], tmp_path: Path
) -> None:
    """The text GGUF + llama.cpp's `gemma4v` mmproj of tests/backends/test_gemma4_mmproj.py: the MLX
    runner's embedder loads the projector's tower, and it gives transformers' embeddings."""
    from localchat.backends.mlx.vision.gemma4 import Gemma4Vision
    from localchat.backends.mlx.vision.images import load_image_embedder

    hf, model, _ = pair
    embedder = load_image_embedder(model, mx.float32)
    assert embedder is not None and isinstance(embedder.vision, Gemma4Vision)
    spec = Gemma4ImageSpec(patch_size=4, max_soft_tokens=70)  # the folder's processor config
    for path in pictures(tmp_path)[:2]:
        ref = _reference(path)
        ours = np.array(
            embedder.vision.encode(mx.array(preprocess(decode(path.read_bytes()), spec))[None])[0]
        )
        with torch.no_grad():
            theirs = hf.model.get_image_features(
                pixel_values=ref["pixel_values"], image_position_ids=ref["image_position_ids"]
            ).pooler_output[0]
        assert np.abs(ours - theirs.numpy()).max() < 1e-4
