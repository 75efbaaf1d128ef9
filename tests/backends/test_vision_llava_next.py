"""LLaVA-NeXT / LLaVA 1.6 image input (#29: LLaVA's CLIP tower + MLP projector with "anyres" tiling)
against transformers on a tiny random LlavaNextForConditionalGeneration, fp32: the whole picture and its
tiles equal LlavaNextImageProcessor's Pillow backend bit for bit on real files of several aspect ratios,
the number of image tokens equals LlavaNextProcessor's, the packed features (unpadded, image_newline rows)
equal get_image_features, and an image prompt's logits and greedy tokens equal transformers', with a
prefill chunk boundary inside the image's run and through the engine."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import LlavaNextProcessor, PreTrainedTokenizerFast
from transformers.models.llava_next import LlavaNextImageProcessorPil

from localchat.backends.torch.vision.llava_next import LlavaNextVision, load_llava_next_vision
from localchat.engine.request import ImageInput
from localchat.vision.llava_next_prompt import AnyresPixels, LlavaNextImagePrompt
from localchat.vision.model_info import vision_config
from localchat.weights.loader import load_model
from tests.helpers import llava_next_models as tiny
from tests.helpers import picture_parity as picture
from tests.helpers.torch_batch import PagedDriver
from tests.helpers.torch_models import fp32_runner

pytestmark = pytest.mark.slow

IMAGE = tiny.IMAGE


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    folder = tmp_path_factory.mktemp("llava-next")
    return tiny.write_folder(folder), folder


@pytest.fixture(scope="module")
def pictures(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return tiny.pictures(tmp_path_factory.mktemp("pictures"))


def _prompt_side(folder: Path) -> LlavaNextImagePrompt:
    config = vision_config(folder)
    assert config is not None and config["model_type"] == "llava_next"
    return LlavaNextImagePrompt.from_config(folder, config)


def _prompt(count: int) -> list[int]:
    return [1, 3, *[IMAGE] * count, 5, 6, 7, 8, 4]


def test_preprocessing_and_token_counts_equal_transformers(
    saved: tuple[Any, Path], pictures: list[Path], tmp_path: Path
) -> None:
    _, folder = saved
    ours_side = _prompt_side(folder)
    theirs = LlavaNextImageProcessorPil(**tiny.PREPROCESSOR)
    processor = LlavaNextProcessor(
        image_processor=theirs,
        tokenizer=PreTrainedTokenizerFast.from_pretrained(folder),
        patch_size=tiny.VISION["patch_size"],
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,  # the CLS row, as llava-hf's processor configs say
    )
    rgba = tmp_path / "rgba.png"  # transparency composited on white, as transformers does
    Image.fromarray(np.random.default_rng(4).integers(0, 256, (50, 33, 4), dtype=np.uint8), "RGBA").save(rgba)
    tile_counts = set()
    for path in [*pictures, rgba]:
        ours = ours_side.preprocess(Image.open(path))
        out = theirs(Image.open(path), return_tensors="np")
        expected = out["pixel_values"][0]
        assert ours.tiles.shape == expected.shape and ours.tiles.dtype == expected.dtype, path.name
        assert np.array_equal(ours.tiles, expected), path.name  # bit for bit, the base image and every tile
        assert ours.image_size == tuple(int(v) for v in out["image_sizes"][0])
        tile_counts.add(ours.tiles.shape[0] - 1)
        ids = processor(text="USER: <image>\nwhat", images=Image.open(path))["input_ids"][0]
        assert ours_side.grid(ours) == int((np.asarray(ids) == IMAGE).sum()), path.name
    assert tile_counts == {2, 3, 4}  # wide/tall, very wide, near-square: different best resolutions


def _tiles(side: LlavaNextImagePrompt, path: Path) -> AnyresPixels:
    return side.preprocess(Image.open(path))


def _hf_features(hf: Any, pixels: AnyresPixels, **kwargs: Any) -> torch.Tensor:
    with torch.no_grad():
        out = hf.model.get_image_features(
            pixel_values=torch.from_numpy(pixels.tiles)[None],
            image_sizes=torch.tensor([pixels.image_size]),
            **kwargs,
        ).pooler_output
    return out[0]


@pytest.mark.parametrize("layer", [-2, [-3, -1]], ids=str)
def test_image_features_equal_transformers(
    tmp_path: Path, pictures: list[Path], layer: int | list[int]
) -> None:
    folder = tmp_path / "m"
    hf = tiny.write_folder(folder, vision_feature_layer=layer)
    vision = load_llava_next_vision(folder)
    side = _prompt_side(folder)
    for path in pictures:
        pixels = _tiles(side, path)
        ours = vision.encode_anyres(torch.from_numpy(pixels.tiles), pixels.image_size)
        theirs = _hf_features(hf, pixels)
        assert ours.shape == theirs.shape == (side.grid(pixels), tiny.TEXT["hidden_size"]), path.name
        err = (ours - theirs).abs().max().item()
        print(f"llava-next features max abs err fp32 ({path.name}, layer {layer}): {err:.2e}")
        assert err < 1e-5


def _hf_logits(hf: Any, tokens: list[int], pixels: AnyresPixels) -> np.ndarray:
    with torch.no_grad():
        return (
            hf(
                input_ids=torch.tensor([tokens]),
                pixel_values=torch.from_numpy(pixels.tiles)[None],
                image_sizes=torch.tensor([pixels.image_size]),
            )
            .logits[0]
            .float()
            .numpy()
        )


@pytest.mark.parametrize("chunk", [None, 9])
def test_image_prompt_logits_and_greedy_tokens(
    saved: tuple[Any, Path], pictures: list[Path], chunk: int | None
) -> None:
    """The packed rows scattered at the placeholders of a prefill (whole, or split by chunked prefill in
    the middle of the image's run) give transformers' logits and greedy tokens."""
    hf, folder = saved
    side = _prompt_side(folder)
    vision = load_llava_next_vision(folder)
    pixels = _tiles(side, pictures[0])
    embeds = vision.encode_anyres(torch.from_numpy(pixels.tiles), pixels.image_size)
    prompt = _prompt(side.grid(pixels))
    placeholders = [i for i, t in enumerate(prompt) if t == IMAGE]
    driver = PagedDriver(fp32_runner(load_model(folder)))
    picture.assert_prefill_and_greedy(
        driver,
        prompt,
        picture.spans(len(prompt), chunk),
        picture.scattered_rows(driver, placeholders, embeds),
        partial(_hf_logits, hf, pixels=pixels),
        "llava-next",
    )


@pytest.mark.parametrize("chunk", [0, 13])
def test_engine_greedy_equals_transformers(saved: tuple[Any, Path], pictures: list[Path], chunk: int) -> None:
    """Through LLMEngine + TorchRunner (the runner's own tower and encoder cache), pictures of different
    shapes (so different token counts), each twice: the second turn from the prefix cache."""
    hf, folder = saved
    _engine_check(hf, folder, pictures[:2], chunk)


def _engine_check(hf: Any, model_path: Path, pictures: list[Path], chunk: int) -> None:
    from localchat.vision.gemma3_preprocess import content_hash

    side = _prompt_side(model_path)
    bundle = load_model(model_path)
    runner = fp32_runner(bundle)
    assert isinstance(runner.images.vision, LlavaNextVision)  # type: ignore[union-attr]
    cases = []
    for path in pictures:
        pixels = _tiles(side, path)
        prompt = _prompt(side.grid(pixels))
        (run,) = side.placeholders(prompt, [side.grid(pixels)])
        images = picture.inputs_for(run, content_hash(path.read_bytes()), pixels)
        reference = partial(_hf_logits, hf, pixels=pixels)
        cases.append(
            picture.Case(path.name, prompt, images, partial(picture.hf_greedy, reference, prompt, 6))
        )
    picture.assert_twice_from_the_caches(picture.small_engine(runner, bundle.tokenizer, chunk, 256), cases, 6)


def test_full_strategy_is_a_load_error(tmp_path: Path) -> None:
    """Under "full" each tile keeps its CLS row, which breaks the stitched patch grid (transformers'
    pack_image_features fails too): a typed error at load, not made-up embeddings."""
    from localchat.errors import ModelLoadError

    folder = tmp_path / "full"
    tiny.write_folder(folder, vision_feature_select_strategy="full")
    with pytest.raises(ModelLoadError, match="'default'"):
        load_llava_next_vision(folder)


def test_request_images_path_equals_the_processor(saved: tuple[Any, Path], pictures: list[Path]) -> None:
    """The API's path (request_images): model_info says vision; two pictures of different shapes in one
    message give LlavaNextProcessor's input ids, and each ImageInput carries the processor's pixels and
    the picture's size over exactly its run of image tokens."""
    import base64

    from localchat.vision.content import ImageLimits
    from localchat.vision.model_info import takes_images
    from localchat.vision.request_images import prepare_images

    _, folder = saved
    assert takes_images(folder)
    urls = [f"data:image/png;base64,{base64.b64encode(p.read_bytes()).decode()}" for p in pictures[:2]]
    content: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    messages = [{"role": "user", "content": [*content, {"type": "text", "text": "what"}]}]
    prepared = prepare_images(messages, folder, "tiny", ImageLimits())
    text = prepared.expand("USER: <image>\n<image>\nwhat")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    processor = LlavaNextProcessor(
        image_processor=LlavaNextImageProcessorPil(**tiny.PREPROCESSOR),
        tokenizer=tokenizer,
        patch_size=tiny.VISION["patch_size"],
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
    )
    images = [Image.open(p) for p in pictures[:2]]
    theirs = processor(
        text="USER: <image>\n<image>\nwhat", images=images, add_special_tokens=False, return_tensors="pt"
    )
    assert ids == theirs["input_ids"][0].tolist()
    inputs = prepared.inputs(ids)
    assert len(inputs) == 2 and len(inputs[0].placeholders) != len(inputs[1].placeholders)
    for image, expected, size in zip(inputs, theirs["pixel_values"], theirs["image_sizes"], strict=True):
        assert all(ids[i] == IMAGE for i in image.placeholders)
        assert isinstance(image.pixels, AnyresPixels) and image.pixels.image_size == tuple(size.tolist())
        tiles = image.pixels.tiles
        assert np.array_equal(tiles, expected[: tiles.shape[0]].numpy())  # the processor pads the batch


# --- MLX: the same tower and the MLX runner's image path (float32 on MLX's CPU device) -------------------


@pytest.mark.mlx
def test_mlx_features_equal_transformers(saved: tuple[Any, Path], pictures: list[Path]) -> None:
    mx = pytest.importorskip("mlx.core")
    from localchat.backends.mlx.vision.llava_next import load_llava_next_vision as load_mlx

    hf, folder = saved
    side = _prompt_side(folder)
    vision = load_mlx(folder)
    for path in pictures:
        pixels = _tiles(side, path)
        ours = np.array(vision.encode_anyres(mx.array(pixels.tiles), pixels.image_size))
        theirs = _hf_features(hf, pixels).numpy()
        err = np.abs(ours - theirs).max()
        print(f"mlx llava-next features max abs err fp32 ({path.name}): {err:.2e}")
        assert ours.shape == theirs.shape and err < 1e-4


@pytest.mark.mlx
@pytest.mark.parametrize("chunk", [None, 9])
def test_mlx_image_prompt_logits_and_greedy_tokens(
    saved: tuple[Any, Path], pictures: list[Path], chunk: int | None
) -> None:
    """Through the MLX runner's compute_logits with image slices as engine/batch.py builds them (chunk=9
    splits the image's run): transformers' logits and greedy tokens; the picture is encoded once."""
    pytest.importorskip("mlx.core")
    from localchat.vision.gemma3_preprocess import content_hash
    from tests.helpers.parity import Driver, mlx_runner

    hf, folder = saved
    side = _prompt_side(folder)
    path = pictures[1]
    pixels = _tiles(side, path)
    prompt = _prompt(side.grid(pixels))
    (run,) = side.placeholders(prompt, [side.grid(pixels)])
    runner = mlx_runner(load_model(folder))
    assert runner.images is not None
    image = ImageInput(run, content_hash(path.read_bytes()), pixels)
    driver = Driver(runner)
    steps = picture.spans(len(prompt), chunk)
    reference = partial(_hf_logits, hf, pixels=pixels)
    picture.assert_prefill_and_greedy(
        driver, prompt, steps, picture.image_slices(driver, image), reference, "mlx llava-next"
    )
    picture.assert_encoded_once(runner, image, steps)


# --- GGUF + llama.cpp's LLaVA-NeXT `mlp` mmproj (image_grid_pinpoints, model.image_newline) -----------------


@pytest.fixture(scope="module")
def gguf_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path, Path, Path]:
    from tests.helpers.llava_gguf import round_to_f16
    from tests.helpers.llava_next_gguf import write_next_gguf_pair

    folder = tmp_path_factory.mktemp("llava-next-f16-exact")
    hf = tiny.write_folder(folder)
    round_to_f16(hf)  # the mmproj script stores the conv and projector matrices in f16
    hf.save_pretrained(folder)
    model, mmproj = write_next_gguf_pair(folder, tmp_path_factory.mktemp("llava-next-gguf"))
    return hf, folder, model, mmproj


def test_mmproj_pairs_and_gives_transformers_features(
    gguf_pair: tuple[Any, Path, Path, Path], pictures: list[Path]
) -> None:
    from localchat.backends.torch.vision.llava_next import load_llava_next_mmproj

    hf, folder, model, mmproj = gguf_pair
    config = vision_config(model)  # the only mmproj beside the model: paired
    assert config is not None and config["model_type"] == "llava_next" and config["mmproj"] == str(mmproj)
    assert config["image_grid_pinpoints"] == tiny.PINPOINTS and config["image_token_index"] == IMAGE
    side = LlavaNextImagePrompt.from_config(model, config)
    folder_side = _prompt_side(folder)
    vision = load_llava_next_mmproj(config, mmproj)
    for path in pictures:
        pixels = _tiles(side, path)
        assert np.array_equal(pixels.tiles, _tiles(folder_side, path).tiles)  # the same preprocessing
        ours = vision.encode_anyres(torch.from_numpy(pixels.tiles), pixels.image_size)
        err = (ours - _hf_features(hf, pixels)).abs().max().item()
        print(f"llava-next mmproj features max abs err fp32 ({path.name}): {err:.2e}")
        assert err < 1e-5


@pytest.mark.parametrize("chunk", [0, 13])
def test_gguf_pair_engine_greedy_equals_transformers(
    gguf_pair: tuple[Any, Path, Path, Path], pictures: list[Path], chunk: int
) -> None:
    """The text GGUF with the paired mmproj through the engine: transformers' greedy tokens, a chunk
    boundary inside the image's run, the second turn from the prefix cache."""
    hf, _, model, _ = gguf_pair
    _engine_check(hf, model, pictures[:2], chunk)


@pytest.mark.mlx
def test_mlx_mmproj_features_equal_transformers(
    gguf_pair: tuple[Any, Path, Path, Path], pictures: list[Path]
) -> None:
    """The MLX image embedder of the GGUF pair (its loader picks the LLaVA-NeXT mmproj tower)."""
    mx = pytest.importorskip("mlx.core")
    from localchat.backends.mlx.vision.images import load_image_embedder
    from localchat.backends.mlx.vision.llava_next import LlavaNextVision as MlxLlavaNext

    hf, _, model, _ = gguf_pair
    embedder = load_image_embedder(model, mx.float32)
    assert embedder is not None and isinstance(embedder.vision, MlxLlavaNext)
    side = _prompt_side(model)
    for path in pictures:
        pixels = _tiles(side, path)
        ours = np.array(embedder.vision.encode_anyres(mx.array(pixels.tiles), pixels.image_size))
        err = np.abs(ours - _hf_features(hf, pixels).numpy()).max()
        print(f"mlx llava-next mmproj features max abs err fp32 ({path.name}): {err:.2e}")
        assert err < 1e-4


def test_token_counts_and_extreme_shapes_equal_transformers(saved: tuple[Any, Path]) -> None:
    """The token arithmetic on 70 picture sizes (1 x 1, 1 x 1000, just off a tile's size, random) equals
    LlavaNextProcessor's; pictures so thin that no feature row survives the unpadding still give the
    processor's pixels and transformers' features (the whole picture's rows only)."""
    hf, folder = saved
    side = _prompt_side(folder)
    processor = LlavaNextProcessor(
        image_processor=LlavaNextImageProcessorPil(**tiny.PREPROCESSOR),
        tokenizer=PreTrainedTokenizerFast.from_pretrained(folder),
        patch_size=tiny.VISION["patch_size"],
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
    )
    rng = np.random.default_rng(5)
    sizes = [(1, 1), (1, 1000), (1000, 1), (2, 500), (57, 56), (56, 57), (335, 336), (10, 11)]
    sizes += [(int(h), int(w)) for h, w in rng.integers(1, 400, (62, 2))]
    for h, w in sizes:
        theirs = processor._get_number_of_features(h, w, tiny.TILE, tiny.TILE) - 1  # "default": no CLS
        assert side.tokens_per_image((h, w)) == theirs, (h, w)
    vision = load_llava_next_vision(folder)
    for h, w in [(1, 1), (1, 300), (300, 2)]:
        image = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB")
        pixels = side.preprocess(image)
        assert np.array_equal(
            pixels.tiles, processor.image_processor(image, return_tensors="np")["pixel_values"][0]
        )
        ours = vision.encode_anyres(torch.from_numpy(pixels.tiles), pixels.image_size)
        theirs_features = _hf_features(hf, pixels)
        assert ours.shape == theirs_features.shape == (side.grid(pixels), tiny.TEXT["hidden_size"])
        assert (ours - theirs_features).abs().max().item() < 1e-5
