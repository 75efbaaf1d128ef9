"""Llama 4 image input (#29: the unfold patch embedding, class token, 2-D rotary encoder, pixel-shuffle
adapter and projector) against transformers on a tiny random Llama4ForConditionalGeneration, fp32: the
tiling and pixel values equal transformers' Llama4ImageProcessor bit for bit on real PNG / JPEG files of
three aspect ratios (that processor needs torchvision: without it the resize and the bfloat16
normalisation are checked against the torch ops it runs), the prompt expansion equals Llama4Processor's
token ids, the tower's rows equal get_image_features + the projector, and an image prompt's logits and
greedy tokens equal transformers', also with a prefill chunk boundary inside the picture, and through
the engine on a second turn from the prefix cache."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from tokenizers import Tokenizer
from transformers.models.llama4.processing_llama4 import Llama4Processor

from localchat.backends.torch.vision.llama4 import Llama4Vision, load_llama4_vision
from localchat.vision.llama4_preprocess import (
    Llama4ImageSpec,
    _normalize,
    preprocess_llama4,
    resize_bilinear,
)
from localchat.vision.llama4_prompt import Llama4ImagePrompt, image_text
from localchat.vision.model_info import takes_images, vision_config
from localchat.weights.loader import load_model
from tests.helpers import llama4_vision_models as tiny
from tests.helpers import picture_parity as picture
from tests.helpers.torch_batch import PagedDriver
from tests.helpers.torch_models import fp32_runner

pytestmark = pytest.mark.slow

QUESTION = "what is in this picture ?"


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    folder = tmp_path_factory.mktemp("llama4")
    return tiny.write_folder(folder), folder


def _odd_pictures(folder: Path) -> list[Path]:
    rng = np.random.default_rng(2)
    out = []
    for name, array, mode in (
        ("rgba.png", rng.integers(0, 256, (33, 80, 4), dtype=np.uint8), "RGBA"),  # composited on white
        ("gray.png", rng.integers(0, 256, (100, 57), dtype=np.uint8), "L"),
        ("big.jpg", rng.integers(0, 256, (300, 170, 3), dtype=np.uint8), "RGB"),  # shrunk into 3 x 2
        ("square.png", rng.integers(0, 256, (32, 32, 3), dtype=np.uint8), "RGB"),
    ):
        path = folder / name
        Image.fromarray(array, mode).save(path)
        out.append(path)
    return out


@pytest.mark.parametrize("tile", [tiny.TILE, 336])
def test_preprocessing_equals_transformers(tmp_path: Path, tile: int) -> None:
    pytest.importorskip("torchvision")  # transformers' Llama4ImageProcessor is torchvision-only
    from transformers import Llama4ImageProcessor

    raw = {**tiny.PREPROCESSOR, "size": {"height": tile, "width": tile}}
    processor = Llama4ImageProcessor(**raw)
    spec = Llama4ImageSpec.from_dict(raw)
    for path in [*tiny.pictures(tmp_path), *_odd_pictures(tmp_path)]:
        theirs = processor(Image.open(path), return_tensors="pt")
        ours, tiles = preprocess_llama4(Image.open(path), spec)
        assert tiles == tuple(theirs["aspect_ratios"][0].tolist()), path.name
        assert np.array_equal(ours, theirs["pixel_values"].float().numpy()), path.name


def test_resize_and_normalisation_equal_the_torch_ops(tmp_path: Path) -> None:
    """What the processor runs (torchvision's resize is torch's antialiased bilinear on uint8; rescale and
    normalise in bfloat16), checked without torchvision."""
    rng = np.random.default_rng(3)
    for h, w, nh, nw in [(300, 500, 201, 336), (90, 61, 32, 21), (20, 24, 32, 32), (677, 336, 470, 233)]:
        pixels = rng.integers(0, 256, (3, h, w), dtype=np.uint8)
        theirs = F.interpolate(torch.from_numpy(pixels)[None], (nh, nw), mode="bilinear", antialias=True)
        assert np.array_equal(resize_bilinear(pixels, nh, nw), theirs[0].numpy()), (h, w, nh, nw)
    pixels = rng.integers(0, 256, (3, 16, 16), dtype=np.uint8)
    spec = Llama4ImageSpec(mean=(0.48145466, 0.4578275, 0.40821073), std=(0.26862954, 0.26130258, 0.27577711))
    for s in (spec, Llama4ImageSpec()):
        x = torch.from_numpy(pixels).to(torch.bfloat16) * s.rescale
        mean = torch.tensor(s.mean, dtype=torch.bfloat16)[:, None, None]
        std = torch.tensor(s.std, dtype=torch.bfloat16)[:, None, None]
        assert np.array_equal(_normalize(pixels, s), x.sub_(mean).div_(std).float().numpy())


def _chat_text(pictures: int) -> str:
    return (
        "<|begin_of_text|><|header_start|>user<|header_end|> "
        + "<|image|>" * pictures
        + QUESTION
        + "<|eot|> <|header_start|>assistant<|header_end|> "
    )


def _prompt(folder: Path) -> Llama4ImagePrompt:
    config = vision_config(folder)
    assert config is not None
    return Llama4ImagePrompt.from_config(folder, config)


def _processor_string(tiles: tuple[int, int]) -> str:
    """Llama4Processor's string for one picture (its method reads no processor state)."""
    return str(Llama4Processor._prompt_split_image(cast(Any, None), tiles, tiny.TOKENS_PER_TILE))


def test_prompt_expansion_equals_the_processor(saved: tuple[Any, Path], tmp_path: Path) -> None:
    _, folder = saved
    assert takes_images(folder)
    prompt = _prompt(folder)
    assert prompt.per_tile == tiny.TOKENS_PER_TILE and prompt.patch_token_id == tiny.PATCH_ID
    for rows, cols in [(1, 1), (2, 3), (3, 1)]:
        assert image_text(rows, cols, tiny.TOKENS_PER_TILE) == _processor_string((rows, cols))
    paths = tiny.pictures(tmp_path)
    prepared = [prompt.preprocess(Image.open(p)) for p in paths]
    assert [tiles for _, tiles in prepared] == [(2, 3), (3, 2), (1, 1)]
    text = _chat_text(len(paths))
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    ids = tokenizer.encode(prompt.expand(text, [tiles for _, tiles in prepared])).ids
    pieces = text.split("<|image|>")  # each <|image|> in turn -> the processor's string for its picture
    theirs_text = pieces[0] + "".join(
        _processor_string(t) + rest for (_, t), rest in zip(prepared, pieces[1:], strict=True)
    )
    assert ids == tokenizer.encode(theirs_text).ids
    images = prompt.inputs(ids, [(str(i), px, tiles) for i, (px, tiles) in enumerate(prepared)])
    sizes = [(7, 7, 1)[i] * tiny.TOKENS_PER_TILE for i in range(3)]  # 6 tiles + global, 6 + global, 1
    assert [len(image.placeholders) for image in images] == sizes
    assert all(ids[p] == tiny.PATCH_ID for image in images for p in image.placeholders)
    with pytest.raises(ValueError, match="image slots"):
        prompt.expand(text, [(1, 1)])
    with pytest.raises(ValueError, match="patch tokens"):  # a prompt cut inside the last picture
        prompt.inputs(ids[:-30], [(str(i), px, tiles) for i, (px, tiles) in enumerate(prepared)])


def test_full_processor_token_ids(saved: tuple[Any, Path], tmp_path: Path) -> None:
    """Llama4Processor end to end (needs torchvision for its image processor)."""
    pytest.importorskip("torchvision")
    from transformers import Llama4ImageProcessor, PreTrainedTokenizerFast

    _, folder = saved
    processor = Llama4Processor(
        Llama4ImageProcessor(**tiny.PREPROCESSOR),
        PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json")),
        patch_size=tiny.PATCH,
    )
    paths = tiny.pictures(tmp_path)
    text = _chat_text(len(paths))
    theirs = processor(text=text, images=[Image.open(p) for p in paths])["input_ids"][0]
    prompt = _prompt(folder)
    tiles = [prompt.preprocess(Image.open(p))[1] for p in paths]
    ids = Tokenizer.from_file(str(folder / "tokenizer.json")).encode(prompt.expand(text, tiles)).ids
    assert ids == list(theirs)


def _pixels(folder: Path, path: Path) -> tuple[torch.Tensor, tuple[int, int]]:
    pixels, tiles = _prompt(folder).preprocess(Image.open(path))
    return torch.from_numpy(pixels), tiles


def _hf_features(hf: Any, pixels: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        features = hf.get_image_features(pixel_values=pixels).last_hidden_state
        return hf.multi_modal_projector(features.reshape(-1, features.shape[-1]))


def test_image_features_equal_transformers(saved: tuple[Any, Path], tmp_path: Path) -> None:
    hf, folder = saved
    vision = load_llama4_vision(folder)
    assert vision is not None
    for path in tiny.pictures(tmp_path):
        pixels, _ = _pixels(folder, path)
        ours = vision.encode(pixels[None])[0]
        theirs = _hf_features(hf, pixels)
        err = (ours - theirs).abs().max().item()
        print(f"llama4 image features max abs err fp32 ({path.name}): {err:.2e}")
        assert ours.shape == theirs.shape and err < 1e-5


def _prompt_ids(folder: Path, tiles: list[tuple[int, int]]) -> list[int]:
    text = _prompt(folder).expand(_chat_text(len(tiles)), tiles)
    return list(Tokenizer.from_file(str(folder / "tokenizer.json")).encode(text).ids)


def _hf_logits(hf: Any, tokens: list[int], pixels: torch.Tensor) -> np.ndarray:
    """Llama4ForConditionalGeneration.forward's own steps (get_image_features, the projector,
    masked_scatter at the image_token_index positions, the text LM): in transformers 5.24 the wrapper's
    forward computes them, then fails building its output (`image_outputs` missing)."""
    ids = torch.tensor([tokens])
    with torch.no_grad():
        embeds = hf.get_input_embeddings()(ids)
        mask = (ids == hf.config.image_token_id)[..., None].expand_as(embeds)
        embeds = embeds.masked_scatter(mask, _hf_features(hf, pixels).to(embeds.dtype))
        return hf.language_model(inputs_embeds=embeds).logits[0].float().numpy()


@pytest.mark.parametrize("chunk", [None, 60])
def test_image_prompt_logits_and_greedy_tokens(
    saved: tuple[Any, Path], tmp_path: Path, chunk: int | None
) -> None:
    """The picture's rows scattered at its <|patch|> tokens in a prefill (whole, or split by chunked
    prefill inside the picture, between tile separators) give transformers' logits and greedy tokens."""
    hf, folder = saved
    vision = load_llama4_vision(folder)
    assert vision is not None
    pixels, tiles = _pixels(folder, tiny.pictures(tmp_path)[0])
    prompt = _prompt_ids(folder, [tiles])
    embeds = vision.encode(pixels[None])[0]  # encoded once, whole
    placeholders = [i for i, t in enumerate(prompt) if t == tiny.PATCH_ID]
    assert len(placeholders) == embeds.shape[0]
    runner = fp32_runner(load_model(folder))
    assert isinstance(runner.images.vision, Llama4Vision)  # type: ignore[union-attr]
    driver = PagedDriver(runner)
    picture.assert_prefill_and_greedy(
        driver,
        prompt,
        picture.spans(len(prompt), chunk),
        picture.scattered_rows(driver, placeholders, embeds),
        lambda tokens: _hf_logits(hf, tokens, pixels),
        "llama4",
        # the picture matters: with other pixels the prompt's last logits differ
        without_picture=lambda tokens: _hf_logits(hf, tokens, torch.full_like(pixels, 0.5)),
    )


@pytest.mark.parametrize("chunk", [0, 50])
def test_engine_greedy_equals_transformers(saved: tuple[Any, Path], tmp_path: Path, chunk: int) -> None:
    """Through LLMEngine + TorchRunner (the runner's own tower and encoder cache): each picture twice, the
    second time from the prefix cache, gives transformers' greedy tokens; chunk 50 splits the first tile."""
    from localchat.vision.gemma3_preprocess import content_hash

    hf, folder = saved
    prompt_side = _prompt(folder)
    bundle = load_model(folder)
    runner = fp32_runner(bundle)
    cases = []
    for path in tiny.pictures(tmp_path)[:2]:
        pixels, tiles = prompt_side.preprocess(Image.open(path))
        prompt = _prompt_ids(folder, [tiles])
        key = content_hash(path.read_bytes())
        reference = partial(_hf_logits, hf, pixels=torch.from_numpy(pixels))
        cases.append(
            picture.Case(
                path.name,
                prompt,
                partial(prompt_side.inputs, prompt, [(key, pixels, tiles)]),
                partial(picture.hf_greedy, reference, prompt, 5),
            )
        )
    picture.assert_twice_from_the_caches(picture.small_engine(runner, bundle.tokenizer, chunk, 512), cases, 5)


@pytest.mark.mlx
def test_mlx_features_equal_transformers(saved: tuple[Any, Path], tmp_path: Path) -> None:
    mx = pytest.importorskip("mlx.core")
    from localchat.backends.mlx.vision.llama4 import load_llama4_vision as load_mlx

    hf, folder = saved
    vision = load_mlx(folder)
    assert vision is not None
    for path in tiny.pictures(tmp_path):
        pixels, _ = _pixels(folder, path)
        ours = np.array(vision.encode(mx.array(pixels.numpy())[None]))[0]
        theirs = _hf_features(hf, pixels).numpy()
        err = np.abs(ours - theirs).max()
        print(f"mlx llama4 image features max abs err fp32 ({path.name}): {err:.2e}")
        assert ours.shape == theirs.shape and err < 1e-4


@pytest.mark.mlx
@pytest.mark.parametrize("chunk", [None, 60])
def test_mlx_image_prompt_logits_and_greedy_tokens(
    saved: tuple[Any, Path], tmp_path: Path, chunk: int | None
) -> None:
    """Through the MLX runner's compute_logits with image slices as engine/batch.py builds them (chunk=60
    splits the picture inside a tile): transformers' logits and greedy tokens; one encode."""
    pytest.importorskip("mlx.core")
    from localchat.vision.gemma3_preprocess import content_hash
    from tests.helpers.parity import Driver, mlx_runner

    hf, folder = saved
    path = tiny.pictures(tmp_path)[0]
    prompt_side = _prompt(folder)
    pixels, tiles = prompt_side.preprocess(Image.open(path))
    prompt = _prompt_ids(folder, [tiles])
    (image,) = prompt_side.inputs(prompt, [(content_hash(path.read_bytes()), pixels, tiles)])
    runner = mlx_runner(load_model(folder))
    assert runner.images is not None
    driver = Driver(runner)
    steps = picture.spans(len(prompt), chunk)
    torch_pixels = torch.from_numpy(pixels)
    reference = partial(_hf_logits, hf, pixels=torch_pixels)
    picture.assert_prefill_and_greedy(
        driver, prompt, steps, picture.image_slices(driver, image), reference, "mlx llama4"
    )
    picture.assert_encoded_once(runner, image, steps)


def test_text_only_export_runs_as_text(saved: tuple[Any, Path], tmp_path: Path) -> None:
    """A folder keeping the multimodal config.json but none of the vision tensors loads its text model
    with no tower (as before Llama 4 took images), instead of failing."""
    import shutil

    from safetensors.torch import load_file, save_file

    _, folder = saved
    text_only = tmp_path / "text-only"
    shutil.copytree(folder, text_only)
    for path in text_only.glob("*.safetensors"):
        state = load_file(str(path))
        keep = {
            k: v for k, v in state.items() if not k.startswith(("vision_model.", "multi_modal_projector."))
        }
        assert len(keep) < len(state)
        save_file(keep, str(path), metadata={"format": "pt"})
    assert load_llama4_vision(text_only) is None
    runner = fp32_runner(load_model(text_only))
    assert runner.images is None
    assert not takes_images(text_only)  # /v1/models and the API do not promise pictures it cannot see
