"""SmolVLM / Idefics3 image input (#29: SigLIP tower per tile + pixel-shuffle connector) against
transformers on tiny random SmolVLMForConditionalGeneration / Idefics3ForConditionalGeneration, fp32:
the tiling and pixel values equal transformers' Pillow processors bit for bit on real PNG / JPEG files, the
prompt expansion (row/col markers, global image) equals the processor's token ids, the tower's rows equal
get_image_features, and an image prompt's logits and greedy tokens equal transformers', also with a
prefill chunk boundary inside a picture's tiles and on a second turn from the prefix cache."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from tokenizers import Tokenizer
from transformers import Idefics3Processor, PreTrainedTokenizerFast
from transformers.models.idefics3 import Idefics3ImageProcessorPil
from transformers.models.smolvlm import SmolVLMImageProcessorPil
from transformers.models.smolvlm.processing_smolvlm import get_image_prompt_string

from localchat.backends.torch.vision.smolvlm import SmolVLMVision, load_smolvlm_vision
from localchat.vision.model_info import takes_images, vision_config
from localchat.vision.smolvlm_preprocess import SmolVLMImageSpec, preprocess_smolvlm
from localchat.vision.smolvlm_prompt import SmolVLMImagePrompt, image_text
from localchat.weights.loader import load_model
from tests.helpers import picture_parity as picture
from tests.helpers import smolvlm_models as tiny
from tests.helpers.torch_batch import PagedDriver
from tests.helpers.torch_models import fp32_runner

pytestmark = pytest.mark.slow

KINDS = ["smolvlm", "idefics3"]
QUESTION = "what is in this picture ?"


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Any, Path]]:
    out = {}
    for kind in KINDS:
        folder = tmp_path_factory.mktemp(kind)
        out[kind] = (tiny.write_folder(folder, kind), folder)
    return out


def _odd_pictures(folder: Path) -> list[Path]:
    rng = np.random.default_rng(2)
    out = []
    for name, array, mode in (
        ("rgba.png", rng.integers(0, 256, (33, 80, 4), dtype=np.uint8), "RGBA"),  # composited on white
        ("gray.png", rng.integers(0, 256, (100, 57), dtype=np.uint8), "L"),
        ("small.jpg", rng.integers(0, 256, (20, 30, 3), dtype=np.uint8), "RGB"),  # upscaled
        ("square.png", rng.integers(0, 256, (32, 32, 3), dtype=np.uint8), "RGB"),
    ):
        path = folder / name
        Image.fromarray(array, mode).save(path)
        out.append(path)
    return out


@pytest.mark.parametrize(
    "settings",
    [{}, {"do_image_splitting": False}, {"size": {"longest_edge": tiny.TILE}}],
    ids=["split", "no-split", "one-tile"],
)
def test_preprocessing_equals_transformers(tmp_path: Path, settings: dict[str, Any]) -> None:
    raw = {**tiny.PREPROCESSOR, **settings}
    spec = SmolVLMImageSpec.from_dict(raw, tiny.TILE)
    processors = [SmolVLMImageProcessorPil(**raw), Idefics3ImageProcessorPil(**raw)]
    tiles_seen = set()
    for path in [*tiny.pictures(tmp_path), *_odd_pictures(tmp_path)]:
        ours, (rows, cols) = preprocess_smolvlm(Image.open(path), spec)
        tiles_seen.add((rows, cols))
        for processor in processors:
            theirs = processor(Image.open(path), return_tensors="np", return_row_col_info=True)
            assert (rows, cols) == (theirs["rows"][0][0], theirs["cols"][0][0]), path.name
            pixels = theirs["pixel_values"][0]
            assert ours.dtype == pixels.dtype and np.array_equal(ours, pixels), path.name  # bit for bit
    if not settings:  # the wide and the tall picture are cut differently
        assert {(2, 3), (3, 3), (3, 2)} <= tiles_seen
    else:
        assert tiles_seen == {(0, 0)}


def _chat_text(pictures: int) -> str:
    return "<|im_start|>User:" + "<image>" * pictures + QUESTION + "<end_of_utterance>\nAssistant:"


def test_prompt_expansion_equals_the_processor(saved: dict[str, tuple[Any, Path]], tmp_path: Path) -> None:
    _, folder = saved["smolvlm"]
    config = vision_config(folder)
    assert config is not None and takes_images(folder)
    prompt = SmolVLMImagePrompt.from_config(folder, config)
    assert prompt.per_tile == tiny.TOKENS_PER_TILE and prompt.image_token_id == tiny.IMAGE
    for rows, cols in [(0, 0), (2, 3)]:  # SmolVLM's own prompt string
        theirs = get_image_prompt_string(
            rows, cols, tiny.TOKENS_PER_TILE, "<fake_token_around_image>", "<image>", "<global-img>"
        )
        assert image_text(rows, cols, tiny.TOKENS_PER_TILE) == theirs
    paths = tiny.pictures(tmp_path)
    processor = Idefics3Processor(
        Idefics3ImageProcessorPil(**tiny.PREPROCESSOR),
        PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json")),
        image_seq_len=tiny.TOKENS_PER_TILE,
    )
    text = _chat_text(2)
    theirs = processor(text=text, images=[Image.open(p) for p in paths])["input_ids"][0]
    prepared = [prompt.preprocess(Image.open(p)) for p in paths]
    expanded = prompt.expand(text, [tiles for _, tiles in prepared])
    ids = Tokenizer.from_file(str(folder / "tokenizer.json")).encode(expanded).ids
    assert ids == list(theirs)
    images = prompt.inputs(ids, [(str(i), px, tiles) for i, (px, tiles) in enumerate(prepared)])
    sizes = [(rows * cols + 1) * tiny.TOKENS_PER_TILE for _, (rows, cols) in prepared]
    assert [len(image.placeholders) for image in images] == sizes
    assert all(ids[p] == tiny.IMAGE for image in images for p in image.placeholders)
    with pytest.raises(ValueError, match="image slots"):
        prompt.expand(text, [(0, 0)])
    with pytest.raises(ValueError, match="image tokens"):  # a prompt cut inside the second picture
        prompt.inputs(ids[:-60], [(str(i), px, tiles) for i, (px, tiles) in enumerate(prepared)])


def _pixels(folder: Path, path: Path) -> tuple[torch.Tensor, tuple[int, int]]:
    config = vision_config(folder)
    assert config is not None
    pixels, tiles = SmolVLMImagePrompt.from_config(folder, config).preprocess(Image.open(path))
    return torch.from_numpy(pixels)[None], tiles


@pytest.mark.parametrize("kind", KINDS)
def test_image_features_equal_transformers(
    saved: dict[str, tuple[Any, Path]], tmp_path: Path, kind: str
) -> None:
    hf, folder = saved[kind]
    vision = load_smolvlm_vision(folder)
    for path in tiny.pictures(tmp_path):
        pixels, _ = _pixels(folder, path)
        ours = vision.encode(pixels)[0]
        with torch.no_grad():
            theirs = hf.model.get_image_features(pixel_values=pixels).pooler_output[0]
        err = (ours - theirs).abs().max().item()
        print(f"{kind} image features max abs err fp32: {err:.2e}")
        assert ours.shape == theirs.shape and err < 1e-5


def _prompt_ids(folder: Path, tiles: list[tuple[int, int]]) -> list[int]:
    config = vision_config(folder)
    assert config is not None
    text = SmolVLMImagePrompt.from_config(folder, config).expand(_chat_text(len(tiles)), tiles)
    return list(Tokenizer.from_file(str(folder / "tokenizer.json")).encode(text).ids)


def _hf_logits(hf: Any, tokens: list[int], pixels: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return hf(input_ids=torch.tensor([tokens]), pixel_values=pixels).logits[0].float().numpy()


@pytest.mark.parametrize(("kind", "chunk"), [("smolvlm", None), ("smolvlm", 45), ("idefics3", 45)])
def test_image_prompt_logits_and_greedy_tokens(
    saved: dict[str, tuple[Any, Path]], tmp_path: Path, kind: str, chunk: int | None
) -> None:
    """The tiles' rows scattered at the placeholders of a prefill (whole, or split by chunked prefill
    inside the picture, between row markers) give transformers' logits and greedy tokens."""
    hf, folder = saved[kind]
    vision = load_smolvlm_vision(folder)
    pixels, tiles = _pixels(folder, tiny.pictures(tmp_path)[0])
    prompt = _prompt_ids(folder, [tiles])
    embeds = vision.encode(pixels)[0]  # encoded once, whole
    placeholders = [i for i, t in enumerate(prompt) if t == tiny.IMAGE]
    assert len(placeholders) == embeds.shape[0]
    driver = PagedDriver(fp32_runner(load_model(folder)))
    picture.assert_prefill_and_greedy(
        driver,
        prompt,
        picture.spans(len(prompt), chunk),
        picture.scattered_rows(driver, placeholders, embeds),
        partial(_hf_logits, hf, pixels=pixels),
        f"{kind}",
        # the picture matters: with other pixels the prompt's last logits differ (not zeros: transformers
        # drops all-zero tiles as batch padding)
        without_picture=partial(_hf_logits, hf, pixels=torch.full_like(pixels, 0.5)),
    )


def engine_answers(hf: Any, model_path: Path, folder: Path, chunk: int) -> list[list[int]]:
    """Through LLMEngine + TorchRunner (the runner's own tower and encoder cache): each picture twice, the
    second time from the prefix cache, gives transformers' greedy tokens (the prompt ids from the folder's
    tokenizer: a GGUF keeps its ids)."""
    from localchat.vision.gemma3_preprocess import content_hash

    config = vision_config(model_path)
    assert config is not None
    prompt_side = SmolVLMImagePrompt.from_config(model_path, config)
    bundle = load_model(model_path)
    runner = fp32_runner(bundle)
    assert isinstance(runner.images.vision, SmolVLMVision)  # type: ignore[union-attr]
    cases = []
    for path in tiny.pictures(folder):
        pixels, tiles = prompt_side.preprocess(Image.open(path))
        prompt = _prompt_ids(folder, [tiles])
        key = content_hash(path.read_bytes())
        reference = partial(_hf_logits, hf, pixels=torch.from_numpy(pixels)[None])
        cases.append(
            picture.Case(
                path.name,
                prompt,
                partial(prompt_side.inputs, prompt, [(key, pixels, tiles)]),
                partial(picture.hf_greedy, reference, prompt, 6),
            )
        )
    return picture.assert_twice_from_the_caches(
        picture.small_engine(runner, bundle.tokenizer, chunk, 512), cases, 6
    )


@pytest.mark.parametrize("chunk", [0, 13])
def test_engine_greedy_equals_transformers(saved: dict[str, tuple[Any, Path]], chunk: int) -> None:
    hf, folder = saved["smolvlm"]
    engine_answers(hf, folder, folder, chunk)


# --- GGUF + llama.cpp's `idefics3` mmproj --------------------------------------------------------------


@pytest.fixture(scope="module")
def gguf_pair(saved: dict[str, tuple[Any, Path]], tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.helpers.smolvlm_gguf import write_gguf_pair

    _, folder = saved["smolvlm"]
    model, _ = write_gguf_pair(folder, tmp_path_factory.mktemp("smolvlm-gguf"))
    return model


def test_mmproj_pairs_and_gives_transformers_features(
    saved: dict[str, tuple[Any, Path]], gguf_pair: Path
) -> None:
    from localchat.backends.torch.vision.smolvlm import load_smolvlm_mmproj

    hf, folder = saved["smolvlm"]
    config = vision_config(gguf_pair)
    assert config is not None and config["model_type"] == "smolvlm" and takes_images(gguf_pair)
    folder_config = vision_config(folder)
    assert folder_config is not None
    # the tiling sizes and mean/std the mmproj records are the folder's
    assert SmolVLMImagePrompt.from_config(gguf_pair, config) == SmolVLMImagePrompt.from_config(
        folder, folder_config
    )
    vision = load_smolvlm_mmproj(config, Path(config["mmproj"]))
    pixels, _ = _pixels(folder, tiny.pictures(folder)[0])
    with torch.no_grad():
        theirs = hf.model.get_image_features(pixel_values=pixels).pooler_output[0]
    err = (vision.encode(pixels)[0] - theirs).abs().max().item()
    print(f"smolvlm mmproj image features max abs err fp32: {err:.2e}")
    assert err < 1e-5


def test_gguf_pair_greedy_equals_transformers(saved: dict[str, tuple[Any, Path]], gguf_pair: Path) -> None:
    hf, folder = saved["smolvlm"]
    engine_answers(hf, gguf_pair, folder, 13)


# --- MLX: the same tower and connector (float32 on MLX's CPU device) ----------------------------------


@pytest.mark.mlx
@pytest.mark.parametrize("kind", KINDS)
def test_mlx_features_equal_transformers(
    saved: dict[str, tuple[Any, Path]], tmp_path: Path, kind: str
) -> None:
    mx = pytest.importorskip("mlx.core")
    from localchat.backends.mlx.vision.smolvlm import load_smolvlm_vision as load_mlx

    hf, folder = saved[kind]
    vision = load_mlx(folder)
    for path in tiny.pictures(tmp_path):
        pixels, _ = _pixels(folder, path)
        ours = np.array(vision.encode(mx.array(pixels.numpy())))[0]
        with torch.no_grad():
            theirs = hf.model.get_image_features(pixel_values=pixels).pooler_output[0].numpy()
        err = np.abs(ours - theirs).max()
        print(f"mlx {kind} image features max abs err fp32: {err:.2e}")
        assert ours.shape == theirs.shape and err < 1e-4


@pytest.mark.mlx
@pytest.mark.parametrize("chunk", [None, 45])
def test_mlx_image_prompt_logits_and_greedy_tokens(
    saved: dict[str, tuple[Any, Path]], tmp_path: Path, chunk: int | None
) -> None:
    """Through the MLX runner's compute_logits with image slices as engine/batch.py builds them (chunk=45
    splits the picture inside its third tile): transformers' logits and greedy tokens; one encode."""
    pytest.importorskip("mlx.core")
    from localchat.vision.gemma3_preprocess import content_hash
    from tests.helpers.parity import Driver, mlx_runner

    hf, folder = saved["smolvlm"]
    path = tiny.pictures(tmp_path)[0]
    config = vision_config(folder)
    assert config is not None
    prompt_side = SmolVLMImagePrompt.from_config(folder, config)
    pixels, tiles = prompt_side.preprocess(Image.open(path))
    prompt = _prompt_ids(folder, [tiles])
    (image,) = prompt_side.inputs(prompt, [(content_hash(path.read_bytes()), pixels, tiles)])
    runner = mlx_runner(load_model(folder))
    assert runner.images is not None
    driver = Driver(runner)
    steps = picture.spans(len(prompt), chunk)
    reference = partial(_hf_logits, hf, pixels=torch.from_numpy(pixels)[None])
    picture.assert_prefill_and_greedy(
        driver, prompt, steps, picture.image_slices(driver, image), reference, "mlx smolvlm"
    )
    picture.assert_encoded_once(runner, image, steps)


def test_vision_defaults_are_transformers_and_fill_a_sparse_config(
    saved: dict[str, tuple[Any, Path]], tmp_path: Path
) -> None:
    """SmolVLM2's config.json leaves some vision keys out: transformers' defaults fill them."""
    import json
    import shutil

    from transformers import Idefics3VisionConfig, SmolVLMVisionConfig

    from localchat.vision.smolvlm_prompt import VISION_DEFAULTS

    for defaults in (SmolVLMVisionConfig(), Idefics3VisionConfig()):
        assert {key: getattr(defaults, key) for key in VISION_DEFAULTS} == VISION_DEFAULTS
    hf, folder = saved["smolvlm"]
    sparse = tmp_path / "sparse"
    shutil.copytree(folder, sparse)
    config = json.loads((sparse / "config.json").read_text())
    for key in ("hidden_act", "layer_norm_eps"):  # at their defaults in the tiny model
        del config["vision_config"][key]
    (sparse / "config.json").write_text(json.dumps(config))
    pixels, _ = _pixels(sparse, tiny.pictures(tmp_path)[0])
    with torch.no_grad():
        theirs = hf.model.get_image_features(pixel_values=pixels).pooler_output[0]
    assert torch.equal(load_smolvlm_vision(sparse).encode(pixels)[0], theirs)


@pytest.mark.mlx
def test_mlx_mmproj_features_equal_transformers(saved: dict[str, tuple[Any, Path]], gguf_pair: Path) -> None:
    mx = pytest.importorskip("mlx.core")
    from localchat.backends.mlx.vision.images import load_image_embedder

    hf, folder = saved["smolvlm"]
    embedder = load_image_embedder(gguf_pair, mx.float32)  # the pair, through the MLX runner's loader
    assert embedder is not None
    pixels, _ = _pixels(folder, tiny.pictures(folder)[0])
    ours = np.array(embedder.vision.encode(mx.array(pixels.numpy())))[0]
    with torch.no_grad():
        theirs = hf.model.get_image_features(pixel_values=pixels).pooler_output[0].numpy()
    err = np.abs(ours - theirs).max()
    print(f"mlx smolvlm mmproj image features max abs err fp32: {err:.2e}")
    assert err < 1e-4
