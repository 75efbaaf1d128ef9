"""LLaVA-style image input (#29: CLIP ViT tower + 2-layer MLP projector) against transformers on a tiny
random LlavaForConditionalGeneration, fp32: the preprocessing equals transformers' Pillow CLIP / LLaVA
processors bit for bit on real PNG and JPEG files, the tower's embeddings equal get_image_features, and an
image prompt's logits and greedy tokens equal transformers', also with a prefill chunk boundary inside
the image's run and on a second turn from the prefix cache."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from transformers.models.clip import CLIPImageProcessorPil
from transformers.models.llava import LlavaImageProcessorPil

from localchat.backends.torch.vision.llava import LlavaVision, load_llava_vision
from localchat.engine.request import ImageInput
from localchat.vision.clip_preprocess import ClipImageSpec, preprocess_clip
from localchat.vision.llava_prompt import LlavaImagePrompt
from localchat.vision.model_info import vision_config
from localchat.weights.loader import load_model
from tests.helpers import llava_models as tiny
from tests.helpers import picture_parity as picture
from tests.helpers.torch_batch import PagedDriver
from tests.helpers.torch_models import fp32_runner

pytestmark = pytest.mark.slow

PROMPT = [1, 3, *[tiny.IMAGE] * tiny.TOKENS_PER_IMAGE, 5, 6, 7, 8, 4]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    folder = tmp_path_factory.mktemp("llava")
    return tiny.write_folder(folder), folder


def _odd_pictures(folder: Path) -> list[Path]:
    rng = np.random.default_rng(2)
    out = []
    for name, array, mode in (
        ("rgba.png", rng.integers(0, 256, (33, 80, 4), dtype=np.uint8), "RGBA"),  # composited on white
        ("gray.png", rng.integers(0, 256, (100, 57), dtype=np.uint8), "L"),
        ("small.jpg", rng.integers(0, 256, (20, 30, 3), dtype=np.uint8), "RGB"),  # upscaled
    ):
        path = folder / name
        Image.fromarray(array, mode).save(path)
        out.append(path)
    return out


def test_preprocessing_equals_transformers(saved: tuple[Any, Path], tmp_path: Path) -> None:
    _, folder = saved
    spec = ClipImageSpec.from_folder(folder, tiny.IMAGE_SIZE)
    theirs_clip = CLIPImageProcessorPil(**tiny.PREPROCESSOR)
    padded = LlavaImageProcessorPil(**tiny.PREPROCESSOR, do_pad=True)
    padded_spec = ClipImageSpec.from_dict({**tiny.PREPROCESSOR, "do_pad": True}, tiny.IMAGE_SIZE)
    for path in [*tiny.pictures(tmp_path), *_odd_pictures(tmp_path)]:
        ours = preprocess_clip(Image.open(path), spec)
        theirs = theirs_clip(Image.open(path), return_tensors="np")["pixel_values"][0]
        assert ours.shape == (3, tiny.IMAGE_SIZE, tiny.IMAGE_SIZE)
        assert ours.dtype == theirs.dtype and np.array_equal(ours, theirs), path.name  # bit for bit
        ours = preprocess_clip(Image.open(path), padded_spec)
        theirs = padded(Image.open(path), return_tensors="np")["pixel_values"][0]
        assert np.array_equal(ours, theirs), f"{path.name} padded to a square"


def _pixels(folder: Path, path: Path) -> torch.Tensor:
    return torch.from_numpy(preprocess_clip(Image.open(path), ClipImageSpec.from_folder(folder, 56)))[None]


@pytest.mark.parametrize(
    ("layer", "strategy"), [(-2, "default"), (-1, "full"), ([-3, -1], "default")], ids=str
)
def test_image_features_equal_transformers(tmp_path: Path, layer: int | list[int], strategy: str) -> None:
    folder = tmp_path / "m"
    hf = tiny.write_folder(folder, vision_feature_layer=layer, vision_feature_select_strategy=strategy)
    vision = load_llava_vision(folder)
    pixels = torch.cat([_pixels(folder, p) for p in tiny.pictures(tmp_path)])
    ours = vision.encode(pixels)
    with torch.no_grad():
        theirs = hf.model.get_image_features(
            pixel_values=pixels, vision_feature_layer=layer, vision_feature_select_strategy=strategy
        ).pooler_output
    theirs = torch.stack(list(theirs))
    rows = tiny.TOKENS_PER_IMAGE + (strategy == "full")
    assert ours.shape == theirs.shape == (2, rows, tiny.TEXT["hidden_size"])
    err = (ours - theirs).abs().max().item()
    print(f"llava features max abs err fp32 (layer {layer}, {strategy}): {err:.2e}")
    assert err < 1e-5
    assert (ours[0] - ours[1]).abs().max().item() > 1e-2  # different pictures, different embeddings


def test_vision_config_and_prompt_side(saved: tuple[Any, Path]) -> None:
    _, folder = saved
    config = vision_config(folder)
    assert config is not None and config["model_type"] == "llava"
    prompt = LlavaImagePrompt.from_config(folder, config)
    assert prompt.tokens_per_image == tiny.TOKENS_PER_IMAGE and prompt.image_token_id == tiny.IMAGE
    assert prompt.expand("USER: <image>\nhi") == "USER: " + "<image>" * tiny.TOKENS_PER_IMAGE + "\nhi"
    assert prompt.placeholders(PROMPT) == [tuple(range(2, 2 + tiny.TOKENS_PER_IMAGE))]
    with pytest.raises(ValueError, match="consecutive"):
        prompt.placeholders(PROMPT[:5])


def _hf_logits(hf: Any, tokens: list[int], pixels: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return hf(input_ids=torch.tensor([tokens]), pixel_values=pixels).logits[0].float().numpy()


@pytest.mark.parametrize("chunk", [None, 9])
def test_image_prompt_logits_and_greedy_tokens(
    saved: tuple[Any, Path], tmp_path: Path, chunk: int | None
) -> None:
    """The embeddings scattered at the placeholders of a prefill (whole, or split by chunked prefill in
    the middle of the image's run) give transformers' logits and greedy tokens."""
    hf, folder = saved
    vision = load_llava_vision(folder)
    pixels = _pixels(folder, tiny.pictures(tmp_path)[0])
    embeds = vision.encode(pixels)[0]  # encoded once, whole
    placeholders = [i for i, t in enumerate(PROMPT) if t == tiny.IMAGE]
    driver = PagedDriver(fp32_runner(load_model(folder)))
    picture.assert_prefill_and_greedy(
        driver,
        PROMPT,
        picture.spans(len(PROMPT), chunk),
        picture.scattered_rows(driver, placeholders, embeds),
        partial(_hf_logits, hf, pixels=pixels),
        "llava",
        # the picture matters: without its embeddings the prompt's last logits differ
        without_picture=partial(_hf_logits, hf, pixels=torch.zeros_like(pixels)),
    )


def engine_answers(
    hf: Any, model_path: Path, pictures: list[Path], hf_pixels: Callable[[Path], torch.Tensor], chunk: int
) -> None:
    """Through LLMEngine + TorchRunner (the runner's own tower and encoder cache): each picture twice,
    the second time from the prefix cache; the first turn gives transformers' greedy tokens on
    `hf_pixels(picture)`."""
    from localchat.vision.gemma3_preprocess import content_hash

    config = vision_config(model_path)
    assert config is not None
    prompt_side = LlavaImagePrompt.from_config(model_path, config)
    bundle = load_model(model_path)
    runner = fp32_runner(bundle)
    assert isinstance(runner.images.vision, LlavaVision)  # type: ignore[union-attr]
    (run,) = prompt_side.placeholders(PROMPT)
    cases = []
    for path in pictures:
        pixels = prompt_side.preprocess(Image.open(path))
        reference = partial(_hf_logits, hf, pixels=hf_pixels(path))
        images = picture.inputs_for(run, content_hash(path.read_bytes()), pixels)
        cases.append(
            picture.Case(path.name, PROMPT, images, partial(picture.hf_greedy, reference, PROMPT, 6))
        )
    picture.assert_twice_from_the_caches(picture.small_engine(runner, bundle.tokenizer, chunk, 128), cases, 6)


@pytest.mark.parametrize("chunk", [0, 7])
def test_engine_greedy_equals_transformers(saved: tuple[Any, Path], tmp_path: Path, chunk: int) -> None:
    hf, folder = saved
    engine_answers(hf, folder, tiny.pictures(tmp_path), partial(_pixels, folder), chunk)


# --- GGUF + llama.cpp's `mlp` mmproj -------------------------------------------------------------------


@pytest.fixture(scope="module")
def gguf_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path, Path, Path]:
    from tests.helpers.llava_gguf import round_to_f16, write_gguf_pair

    folder = tmp_path_factory.mktemp("llava-f16-exact")
    hf = tiny.write_folder(folder)
    round_to_f16(hf)
    hf.save_pretrained(folder)
    model, mmproj = write_gguf_pair(folder, tmp_path_factory.mktemp("llava-gguf"))
    return hf, folder, model, mmproj


def test_mmproj_pairs_and_gives_transformers_features(
    gguf_pair: tuple[Any, Path, Path, Path], tmp_path: Path
) -> None:
    from localchat.backends.torch.vision.llava_mmproj import load_llava_mmproj

    hf, folder, model, mmproj = gguf_pair
    config = vision_config(model)  # the only mmproj beside the model: paired
    assert config is not None and config["model_type"] == "llava" and config["mmproj"] == str(mmproj)
    assert config["image_token_index"] == tiny.IMAGE
    assert config["vision_config"]["num_hidden_layers"] == tiny.VISION["num_hidden_layers"] - 1
    prompt = LlavaImagePrompt.from_config(model, config)
    assert prompt.tokens_per_image == tiny.TOKENS_PER_IMAGE and prompt.spec.pad_to_square
    vision = load_llava_mmproj(config, mmproj)
    pixels = torch.cat([_pixels(folder, p) for p in tiny.pictures(tmp_path)])
    ours = vision.encode(pixels)
    with torch.no_grad():
        theirs = torch.stack(list(hf.model.get_image_features(pixel_values=pixels).pooler_output))
    err = (ours - theirs).abs().max().item()
    print(f"llava mmproj features max abs err fp32: {err:.2e}")
    assert ours.shape == theirs.shape and err < 1e-5


@pytest.mark.parametrize("chunk", [0, 7])
def test_gguf_pair_greedy_equals_transformers(
    gguf_pair: tuple[Any, Path, Path, Path], tmp_path: Path, chunk: int
) -> None:
    """The text GGUF with the paired mmproj through the engine: transformers' greedy tokens (the same
    pixels go to both), a chunk boundary inside the image's run, the second turn from the prefix cache."""
    hf, _, model, _ = gguf_pair
    config = vision_config(model)
    assert config is not None
    prompt_side = LlavaImagePrompt.from_config(model, config)

    def hf_pixels(path: Path) -> torch.Tensor:
        return torch.from_numpy(prompt_side.preprocess(Image.open(path)))[None]

    engine_answers(hf, model, tiny.pictures(tmp_path), hf_pixels, chunk)


def test_mismatched_or_tokenless_pairs(gguf_pair: tuple[Any, Path, Path, Path], tmp_path: Path) -> None:
    """A llama GGUF of another width with the mmproj: a typed error naming both widths. One of the same
    width without an <image> token (the legacy LLaVA conversions) with the mmproj beside it: text-only;
    named by --mmproj: an error saying why."""
    from localchat.vision.mmproj import MmprojMismatchError, gguf_vision_config
    from tests.helpers.tiny_gguf import TINY_VOCAB_SIZE, write_tiny_gguf
    from tests.helpers.torch_models import tiny_hf_model

    _, _, _, mmproj = gguf_pair
    narrow = tiny_hf_model("llama", vocab_size=TINY_VOCAB_SIZE, hidden_size=32, head_dim=16)
    with pytest.raises(MmprojMismatchError, match=r"width 64.*hidden size 32"):
        load_model(write_tiny_gguf(tmp_path / "narrow.gguf", narrow, qtype="F32"), mmproj=mmproj)
    beside = tmp_path / "legacy"
    beside.mkdir()
    same = tiny_hf_model("llama", vocab_size=TINY_VOCAB_SIZE, hidden_size=64, head_dim=16)
    legacy = write_tiny_gguf(beside / "legacy.gguf", same, qtype="F32")
    shutil.copy(mmproj, beside / mmproj.name)
    assert vision_config(legacy) is None  # paired only when the vocabulary can mark the picture
    with pytest.raises(MmprojMismatchError, match="no <image> token"):
        gguf_vision_config(legacy, beside / mmproj.name)


# --- MLX: the same tower and the MLX runner's image path (float32 on MLX's CPU device) -------------------


@pytest.mark.mlx
@pytest.mark.parametrize("source", ["folder", "gguf"])
def test_mlx_features_equal_transformers(
    saved: tuple[Any, Path], gguf_pair: tuple[Any, Path, Path, Path], tmp_path: Path, source: str
) -> None:
    mx = pytest.importorskip("mlx.core")
    from localchat.backends.mlx.vision.llava import load_llava_mmproj, load_llava_vision

    hf, folder = saved[0], saved[1]
    if source == "gguf":
        hf, folder, model, mmproj = gguf_pair
        config = vision_config(model)
        assert config is not None
        vision = load_llava_mmproj(config, mmproj)
    else:
        vision = load_llava_vision(folder)
    pixels = torch.cat([_pixels(folder, p) for p in tiny.pictures(tmp_path)])
    ours = np.array(vision.encode(mx.array(pixels.numpy())))
    with torch.no_grad():
        theirs = torch.stack(list(hf.model.get_image_features(pixel_values=pixels).pooler_output)).numpy()
    err = np.abs(ours - theirs).max()
    print(f"mlx llava features max abs err fp32 ({source}): {err:.2e}")
    assert ours.shape == theirs.shape and err < 1e-4
    assert np.abs(ours[0] - ours[1]).max() > 1e-2


@pytest.mark.mlx
@pytest.mark.parametrize(("source", "chunk"), [("folder", None), ("folder", 9), ("gguf", 9)])
def test_mlx_image_prompt_logits_and_greedy_tokens(
    saved: tuple[Any, Path],
    gguf_pair: tuple[Any, Path, Path, Path],
    tmp_path: Path,
    source: str,
    chunk: int | None,
) -> None:
    """Through the MLX runner's compute_logits with image slices as engine/batch.py builds them (chunk=9
    splits the image's run at positions 2-17): transformers' logits and greedy tokens; the picture is
    encoded once."""
    pytest.importorskip("mlx.core")
    from localchat.vision.gemma3_preprocess import content_hash
    from tests.helpers.parity import Driver, mlx_runner

    hf, folder = saved
    path = tiny.pictures(tmp_path)[0]
    model_path: Path = folder
    if source == "gguf":
        hf, folder, model_path, _ = gguf_pair
    config = vision_config(model_path)
    assert config is not None
    pixels = LlavaImagePrompt.from_config(model_path, config).preprocess(Image.open(path))
    runner = mlx_runner(load_model(model_path))
    assert runner.images is not None
    image = ImageInput(tuple(range(2, 2 + tiny.TOKENS_PER_IMAGE)), content_hash(path.read_bytes()), pixels)
    driver = Driver(runner)
    steps = picture.spans(len(PROMPT), chunk)
    reference = partial(_hf_logits, hf, pixels=torch.from_numpy(pixels)[None])
    label = f"mlx llava ({source})"
    picture.assert_prefill_and_greedy(
        driver, PROMPT, steps, picture.image_slices(driver, image), reference, label
    )
    picture.assert_encoded_once(runner, image, steps)
