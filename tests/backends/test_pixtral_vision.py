"""Mistral Small 3.x image input (#29: the Pixtral tower with 2-D RoPE + Mistral 3's patch merger and
projector) against transformers on a tiny random Mistral3ForConditionalGeneration, fp32: preprocessing
equals transformers' Pillow Pixtral processor bit for bit on real PNG / JPEG files of several shapes and
modes, the prompt expansion is PixtralProcessor's rows of [IMG] + [IMG_BREAK] ending [IMG_END], the
embeddings equal get_image_features, and an image prompt's logits and greedy tokens equal transformers',
also with a prefill chunk boundary inside the image's run and through the engine with the prefix cache."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from transformers.models.pixtral import PixtralImageProcessorPil

from localchat.backends.torch.vision.pixtral import PixtralVision, load_pixtral_vision
from localchat.engine.request import ImageInput
from localchat.vision.model_info import vision_config
from localchat.vision.pixtral_prompt import PixtralImagePrompt
from localchat.weights.loader import load_model
from tests.helpers import picture_parity as picture
from tests.helpers import pixtral_models as tiny
from tests.helpers.torch_batch import PagedDriver
from tests.helpers.torch_models import fp32_runner

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    folder = tmp_path_factory.mktemp("mistral3")
    return tiny.write_folder(folder), folder


def _prompt_side(folder: Path) -> PixtralImagePrompt:
    config = vision_config(folder)
    assert config is not None
    return PixtralImagePrompt.from_config(folder, config)


def image_run(rows: int, columns: int) -> list[int]:
    """PixtralProcessor's token run for a grid: each row's [IMG]s then [IMG_BREAK], the last [IMG_END]."""
    run = ([tiny.IMG] * columns + [tiny.IMG_BREAK]) * rows
    return [*run[:-1], tiny.IMG_END]


def prompt_for(rows: int, columns: int) -> list[int]:
    """<s>[INST][the picture's run] what is in this picture ?[/INST]"""
    return [1, 3, *image_run(rows, columns), 20, 21, 22, 23, 24, 25, 4]


def _odd_pictures(folder: Path) -> list[Path]:
    rng = np.random.default_rng(2)
    out = []
    for name, array, mode in (
        ("rgba.png", rng.integers(0, 256, (33, 80, 4), dtype=np.uint8), "RGBA"),  # composited on white
        ("gray.png", rng.integers(0, 256, (100, 57), dtype=np.uint8), "L"),
        ("tiny.jpg", rng.integers(0, 256, (5, 9, 3), dtype=np.uint8), "RGB"),  # rounded up to one unit
        ("square.png", rng.integers(0, 256, (40, 40, 3), dtype=np.uint8), "RGB"),  # at the limit exactly
    ):
        path = folder / name
        Image.fromarray(array, mode).save(path)
        out.append(path)
    return out


def test_preprocessing_equals_transformers(saved: tuple[Any, Path], tmp_path: Path) -> None:
    """PixtralProcessor hands its image processor patch_size x spatial_merge_size as the patch: the
    same unit our spec reads from the model's config."""
    _, folder = saved
    prompt = _prompt_side(folder)
    assert prompt.spec.unit == tiny.UNIT and prompt.spec.longest_edge == tiny.LONGEST_EDGE
    theirs_processor = PixtralImageProcessorPil(**{**tiny.PREPROCESSOR, "patch_size": tiny.UNIT})
    shapes = set()
    for path in [*tiny.pictures(tmp_path), *_odd_pictures(tmp_path)]:
        ours = prompt.preprocess(Image.open(path))
        theirs = theirs_processor(Image.open(path), return_tensors="np")
        assert tuple(theirs["image_sizes"][0]) == ours.shape[1:], path.name
        assert ours.dtype == theirs["pixel_values"].dtype
        assert np.array_equal(ours, theirs["pixel_values"][0]), path.name  # bit for bit
        assert ours.shape[1] % tiny.UNIT == 0 and ours.shape[2] % tiny.UNIT == 0
        assert max(ours.shape[1:]) <= tiny.LONGEST_EDGE
        shapes.add(ours.shape)
    assert len(shapes) >= 4  # each picture keeps its own aspect: no fixed square


def test_prompt_expansion_and_placeholders(saved: tuple[Any, Path]) -> None:
    _, folder = saved
    prompt = _prompt_side(folder)
    assert prompt.image_token_id == tiny.IMG
    # PixtralProcessor.replace_image_token for a 32 x 24 picture (unit 8): 4 rows of 3
    expected = ("[IMG]" * 3 + "[IMG_BREAK]") * 3 + "[IMG]" * 3 + "[IMG_END]"
    assert prompt.tokens(4, 3) == expected
    pixels = np.zeros((3, 32, 24), dtype=np.float32)
    assert prompt.grid(pixels) == (4, 3)
    text = prompt.expand("<s>[INST][IMG] what[IMG] and[/INST]", [(4, 3), (1, 2)])
    assert text == f"<s>[INST]{expected} what[IMG][IMG][IMG_END] and[/INST]"
    with pytest.raises(ValueError, match="2 image slots for 1 images"):
        prompt.expand("[IMG][IMG]", [(1, 1)])
    tokens = [1, 3, *image_run(4, 3), 20, *image_run(1, 2), 4]
    runs = prompt.placeholders(tokens, [(4, 3), (1, 2)])
    assert [len(r) for r in runs] == [12, 2]
    assert all(tokens[i] == tiny.IMG for run in runs for i in run)
    assert runs[0][0] == 2 and runs[0][-1] == 2 + 4 * 4 - 2 and runs[1] == (19, 20)
    with pytest.raises(ValueError, match="image tokens where its images need"):
        prompt.placeholders(tokens[:-6], [(4, 3), (1, 2)])


def _pixels(folder: Path, path: Path) -> torch.Tensor:
    return torch.from_numpy(_prompt_side(folder).preprocess(Image.open(path)))[None]


def _hf_features(hf: Any, pixels: torch.Tensor) -> torch.Tensor:
    sizes = torch.tensor([list(pixels.shape[-2:])] * pixels.shape[0])
    with torch.no_grad():
        out = hf.model.get_image_features(pixel_values=pixels, image_sizes=sizes).pooler_output
    return torch.stack(list(out))


@pytest.mark.parametrize("layer", [-1, -2, 1])
def test_image_features_equal_transformers(tmp_path: Path, layer: int) -> None:
    folder = tmp_path / "m"
    hf = tiny.write_folder(folder, vision_feature_layer=layer)
    vision = load_pixtral_vision(folder)
    for path in tiny.pictures(tmp_path):
        pixels = _pixels(folder, path)
        ours, theirs = vision.encode(pixels), _hf_features(hf, pixels)
        rows, columns = pixels.shape[-2] // tiny.UNIT, pixels.shape[-1] // tiny.UNIT
        assert ours.shape == theirs.shape == (1, rows * columns, tiny.TEXT["hidden_size"])
        err = (ours - theirs).abs().max().item()
        print(f"pixtral features max abs err fp32 (layer {layer}, {path.name}): {err:.2e}")
        assert err < 1e-5
    # two same-sized pictures in one batch are encoded independently
    rng = np.random.default_rng(3)
    pair = torch.from_numpy(rng.standard_normal((2, 3, 16, 24)).astype(np.float32))
    ours, theirs = vision.encode(pair), _hf_features(hf, pair)
    assert (ours - theirs).abs().max().item() < 1e-5 and (ours[0] - ours[1]).abs().max().item() > 1e-2


def _hf_logits(hf: Any, tokens: list[int], pixels: torch.Tensor) -> np.ndarray:
    sizes = torch.tensor([list(pixels.shape[-2:])])
    with torch.no_grad():
        out = hf(input_ids=torch.tensor([tokens]), pixel_values=pixels, image_sizes=sizes)
    return out.logits[0].float().numpy()


@pytest.mark.parametrize("chunk", [None, 9])
def test_image_prompt_logits_and_greedy_tokens(
    saved: tuple[Any, Path], tmp_path: Path, chunk: int | None
) -> None:
    """The embeddings scattered at the [IMG] positions of a prefill (whole, or split by chunked prefill
    in the middle of the image's rows) give transformers' logits and greedy tokens."""
    hf, folder = saved
    pixels = _pixels(folder, tiny.pictures(tmp_path)[0])  # 32 x 40: 4 rows of 5
    rows, columns = _prompt_side(folder).grid(pixels[0].numpy())
    prompt = prompt_for(rows, columns)
    embeds = load_pixtral_vision(folder).encode(pixels)[0]  # encoded once, whole
    placeholders = list(_prompt_side(folder).placeholders(prompt, [(rows, columns)])[0])
    driver = PagedDriver(fp32_runner(load_model(folder)))
    picture.assert_prefill_and_greedy(
        driver,
        prompt,
        picture.spans(len(prompt), chunk),
        picture.scattered_rows(driver, placeholders, embeds),
        partial(_hf_logits, hf, pixels=pixels),
        "pixtral",
        # the picture matters: without its embeddings the prompt's last logits differ
        without_picture=partial(_hf_logits, hf, pixels=torch.zeros_like(pixels)),
    )


def _text_config(family: str) -> dict[str, Any]:
    """The tiny text config of each family a Mistral3ForConditionalGeneration wraps: Mistral (Small 3.1 /
    3.2), Ministral 3 (its q temperature exercised: original length 8, the prompts are ~35 tokens) and
    Mistral 4 (Small 4: MLA + MoE, the same temperature)."""
    from transformers import Mistral4Config

    from tests.helpers.torch_models import MINISTRAL3_ROPE, TINY_DEEPSEEK

    if family == "mistral":
        return tiny.TEXT
    rope = {**MINISTRAL3_ROPE, "llama_4_scaling_beta": 0.5}
    if family == "ministral3":
        return {**tiny.TEXT, "model_type": "ministral3", "rope_parameters": rope}
    sizes = {k: v for k, v in tiny.TEXT.items() if k not in ("model_type", "head_dim", "sliding_window")}
    config = Mistral4Config(**{**sizes, **TINY_DEEPSEEK, "q_lora_rank": 24, "rope_parameters": rope})
    return config.to_dict()


@pytest.mark.parametrize("family", ["ministral3", "mistral4"])
def test_other_wrapped_text_models_take_the_pictures(tmp_path: Path, family: str) -> None:
    """Ministral 3 and Mistral Small 4 ship as the same wrapper: their text models scatter the image rows
    too (prefill split inside the image's rows), giving transformers' logits and greedy tokens."""
    folder = tmp_path / family
    hf = tiny.write_folder(folder, _text_config(family))
    pixels = _pixels(folder, tiny.pictures(tmp_path)[0])
    side = _prompt_side(folder)
    grid = side.grid(pixels[0].numpy())
    prompt = prompt_for(*grid)
    embeds = load_pixtral_vision(folder).encode(pixels)[0]
    placeholders = list(side.placeholders(prompt, [grid])[0])
    bundle = load_model(folder)
    assert bundle.config.model_type == family
    driver = PagedDriver(fp32_runner(bundle))
    picture.assert_prefill_and_greedy(
        driver,
        prompt,
        picture.spans(len(prompt), 9),
        picture.scattered_rows(driver, placeholders, embeds),
        partial(_hf_logits, hf, pixels=pixels),
        f"pixtral ({family} text)",
        greedy=2,
        without_picture=partial(_hf_logits, hf, pixels=torch.zeros_like(pixels)),
    )


@pytest.mark.parametrize("chunk", [0, 7])
def test_engine_greedy_equals_transformers(saved: tuple[Any, Path], tmp_path: Path, chunk: int) -> None:
    """Through LLMEngine + TorchRunner (the runner's own tower and encoder cache): each picture twice,
    the second time from the prefix cache; greedy tokens equal transformers', one encode per picture."""
    hf, folder = saved
    engine_answers(hf, folder, tmp_path, chunk)


def engine_answers(hf: Any, model_path: Path, tmp_path: Path, chunk: int) -> None:
    from localchat.vision.gemma3_preprocess import content_hash

    side = _prompt_side(model_path)
    bundle = load_model(model_path)
    runner = fp32_runner(bundle)
    assert isinstance(runner.images.vision, PixtralVision)  # type: ignore[union-attr]
    cases = []
    for path in tiny.pictures(tmp_path):
        pixels = side.preprocess(Image.open(path))
        grid = side.grid(pixels)
        prompt = prompt_for(*grid)
        images = picture.inputs_for(
            side.placeholders(prompt, [grid])[0], content_hash(path.read_bytes()), pixels
        )
        reference = partial(_hf_logits, hf, pixels=torch.from_numpy(pixels)[None])
        cases.append(
            picture.Case(path.name, prompt, images, partial(picture.hf_greedy, reference, prompt, 6))
        )
    picture.assert_twice_from_the_caches(picture.small_engine(runner, bundle.tokenizer, chunk, 128), cases, 6)


# --- MLX: the same tower and the MLX runner's image path (float32 on MLX's CPU device) -------------------


@pytest.mark.mlx
@pytest.mark.parametrize("source", ["folder", "gguf"])
def test_mlx_features_equal_transformers(
    saved: tuple[Any, Path], gguf_pair: tuple[Path, Path], tmp_path: Path, source: str
) -> None:
    mx = pytest.importorskip("mlx.core")
    from localchat.backends.mlx.vision.pixtral import load_pixtral_mmproj as load_mlx_mmproj
    from localchat.backends.mlx.vision.pixtral import load_pixtral_vision as load_mlx

    hf, folder = saved
    if source == "gguf":
        config = vision_config(gguf_pair[0])
        assert config is not None
        vision = load_mlx_mmproj(config, gguf_pair[1])
    else:
        vision = load_mlx(folder)
    for path in tiny.pictures(tmp_path):
        pixels = _pixels(folder, path)
        ours = np.array(vision.encode(mx.array(pixels.numpy())))
        theirs = _hf_features(hf, pixels).numpy()
        err = np.abs(ours - theirs).max()
        print(f"mlx pixtral features max abs err fp32 ({source}, {path.name}): {err:.2e}")
        assert ours.shape == theirs.shape and err < 1e-4


@pytest.mark.mlx
@pytest.mark.parametrize(
    ("family", "chunk"), [("mistral", None), ("mistral", 9), ("ministral3", 9), ("mistral4", 9)]
)
def test_mlx_image_prompt_logits_and_greedy_tokens(
    saved: tuple[Any, Path], tmp_path: Path, family: str, chunk: int | None
) -> None:
    """Through the MLX runner's compute_logits with image slices as engine/batch.py builds them (chunk=9
    splits the image's rows): transformers' logits and greedy tokens for each wrapped text family; the
    picture is encoded once."""
    pytest.importorskip("mlx.core")
    from localchat.vision.gemma3_preprocess import content_hash
    from tests.helpers.parity import Driver, mlx_runner

    hf, folder = saved
    if family != "mistral":
        folder = tmp_path / family
        hf = tiny.write_folder(folder, _text_config(family))
    path = tiny.pictures(tmp_path)[0]
    side = _prompt_side(folder)
    pixels = side.preprocess(Image.open(path))
    grid = side.grid(pixels)
    prompt = prompt_for(*grid)
    runner = mlx_runner(load_model(folder))
    assert runner.images is not None
    image = ImageInput(side.placeholders(prompt, [grid])[0], content_hash(path.read_bytes()), pixels)
    driver = Driver(runner)
    steps = picture.spans(len(prompt), chunk)
    reference = partial(_hf_logits, hf, pixels=torch.from_numpy(pixels)[None])
    label = f"mlx pixtral ({family} text)"
    picture.assert_prefill_and_greedy(
        driver, prompt, steps, picture.image_slices(driver, image), reference, label
    )
    picture.assert_encoded_once(runner, image, steps)


def test_only_wrappers_of_image_taking_text_models_say_vision(
    saved: tuple[Any, Path], tmp_path: Path
) -> None:
    """A Mistral3ForConditionalGeneration around a text family that does not scatter image rows would
    drop the pictures silently: it is not listed as taking images."""
    import json

    from localchat.vision.model_info import takes_images

    _, folder = saved
    assert takes_images(folder)
    config = json.loads((folder / "config.json").read_text())
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({**config, "text_config": {"model_type": "qwen2"}}))
    assert not takes_images(other)


# --- GGUF + llama.cpp's `pixtral` mmproj, both written by llama.cpp's own converter --------------------


@pytest.fixture(scope="module")
def gguf_pair(saved: tuple[Any, Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from tests.helpers.pixtral_gguf import write_gguf_pair

    return write_gguf_pair(saved[1], tmp_path_factory.mktemp("mistral3-gguf"))


def test_mmproj_pairs_and_gives_transformers_features(
    saved: tuple[Any, Path], gguf_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    from localchat.backends.torch.vision.pixtral import load_pixtral_mmproj

    hf, folder = saved
    model, mmproj = gguf_pair
    config = vision_config(model)  # the only mmproj beside the model: paired
    assert config is not None and config["model_type"] == "mistral3" and config["mmproj"] == str(mmproj)
    assert config["image_token_index"] == tiny.IMG and config["spatial_merge_size"] == tiny.MERGE
    assert load_model(model).config.model_type == "ministral3"  # llama.cpp's mistral3 text arch
    side = _prompt_side(model)  # preprocessing from the mmproj's metadata (mean/std stored as float32)
    vision = load_pixtral_mmproj(config, mmproj)
    for path in tiny.pictures(tmp_path):
        pixels = _pixels(folder, path)
        assert np.array_equal(side.preprocess(Image.open(path)), pixels[0].numpy())  # the folder's pixels
        ours, theirs = vision.encode(pixels), _hf_features(hf, pixels)
        err = (ours - theirs).abs().max().item()
        print(f"pixtral mmproj features max abs err fp32 ({path.name}): {err:.2e}")
        assert ours.shape == theirs.shape and err < 1e-5


@pytest.mark.parametrize("chunk", [0, 7])
def test_gguf_pair_greedy_equals_transformers(
    saved: tuple[Any, Path], gguf_pair: tuple[Path, Path], tmp_path: Path, chunk: int
) -> None:
    """The text GGUF with the paired mmproj through the engine: transformers' greedy tokens, a chunk
    boundary inside the image's rows, the second turn from the prefix cache."""
    engine_answers(saved[0], gguf_pair[0], tmp_path, chunk)
