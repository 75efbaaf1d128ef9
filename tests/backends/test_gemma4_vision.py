"""Gemma 4's vision tower + embedder (localchat.backends.torch.vision.gemma4) and image preprocessing
against transformers on a tiny random Gemma4ForConditionalGeneration saved as a safetensors folder, fp32:
- real PNG / JPEG files (one wide, one transparent) preprocess bit for bit as Gemma4ImageProcessorPil does
  (the resized size, the patches, their positions, the soft token count);
- the image embeddings equal get_image_features (clipped linears and standardizing on);
- a prompt with the picture's tokens gives transformers' logits and greedy tokens (mm_token_type_ids as the
  processor passes them), whole or chunked, with and without per-layer embeddings (image rows take the pad
  token's), and with `use_bidirectional_attention: "vision"` (the picture's tokens see each other both ways
  on sliding layers, chunks never cut the picture), where a causal path is shown to miss;
- the prompt expansion is the processor's.
Audio is not built."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from localchat.backends.torch.vision.gemma4 import load_gemma4_vision
from localchat.engine.request import ImageInput
from localchat.vision.gemma3_preprocess import content_hash, decode
from localchat.vision.gemma4_preprocess import Gemma4ImageSpec, patches, preprocess, soft_tokens, target_size
from localchat.vision.gemma4_prompt import Gemma4ImagePrompt
from localchat.vision.model_info import vision_config
from localchat.weights.loader import load_model
from tests.helpers.gemma4_vision_models import (
    IMAGE_SPECIALS,
    TEXT,
    TEXT_PLE,
    image_processor,
    pictures,
    tokenizer,
    write_folder,
)
from tests.helpers.picture_parity import REQ, assert_prefill_and_greedy
from tests.helpers.picture_prefill import prefill_logits, scheduler_chunks
from tests.helpers.torch_batch import PagedDriver
from tests.helpers.torch_models import fp32_runner

IMAGE = IMAGE_SPECIALS["<|image|>"]


# The larger checkpoints' `use_bidirectional_attention: "vision"`: a picture's tokens see each other both ways
# on the sliding layers, within a window shorter than the picture (transformers ANDs the two).
TEXT_BOTH_WAYS: dict[str, Any] = {**TEXT, "use_bidirectional_attention": "vision", "sliding_window": 6}
FOLDERS = {"plain": TEXT, "per-layer-embeddings": TEXT_PLE, "pictures-both-ways": TEXT_BOTH_WAYS}


@pytest.fixture(scope="module", params=list(FOLDERS))
def saved(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    folder = tmp_path_factory.mktemp(f"gemma4v-{request.param}")
    return write_folder(folder, FOLDERS[request.param]), folder


def _reference(path: Path) -> dict[str, torch.Tensor]:
    return dict(image_processor()(Image.open(path), return_tensors="pt"))


def _ours(folder: Path, path: Path) -> np.ndarray:
    spec = Gemma4ImageSpec.from_folder(folder, vision_config(folder)["vision_config"])  # type: ignore[index]
    return preprocess(decode(path.read_bytes()), spec)


def test_preprocessing_matches_the_processor_bit_for_bit(saved: tuple[Any, Path], tmp_path: Path) -> None:
    _, folder = saved
    spec = Gemma4ImageSpec.from_folder(folder, vision_config(folder)["vision_config"])  # type: ignore[index]
    assert (spec.patch_size, spec.max_soft_tokens, spec.pooling_kernel_size) == (4, 70, 3)
    shapes = set()
    for path in pictures(tmp_path):
        ref = _reference(path)
        pixels = _ours(folder, path)
        tiles, xy = patches(pixels, spec.patch_size)
        n = tiles.shape[0]
        assert tiles.dtype == np.float32
        np.testing.assert_array_equal(tiles, ref["pixel_values"][0, :n].numpy())  # bit for bit
        np.testing.assert_array_equal(xy, ref["image_position_ids"][0, :n].numpy())
        assert (ref["image_position_ids"][0, n:] == -1).all()  # the rest is the processor's padding
        assert soft_tokens(pixels, spec) == int(ref["num_soft_tokens_per_image"][0])
        shapes.add(pixels.shape)
    assert len(shapes) == 3  # each picture keeps its own aspect ratio


def test_image_embeddings_match_transformers(saved: tuple[Any, Path], tmp_path: Path) -> None:
    hf, folder = saved
    vision = load_gemma4_vision(folder)
    outs = []
    for path in pictures(tmp_path):
        ref = _reference(path)
        ours = vision.encode(torch.from_numpy(_ours(folder, path))[None])[0]
        with torch.no_grad():
            theirs = hf.model.get_image_features(
                pixel_values=ref["pixel_values"], image_position_ids=ref["image_position_ids"]
            ).pooler_output[0]
        assert ours.shape == theirs.shape == (int(ref["num_soft_tokens_per_image"][0]), 64)
        err = (ours - theirs).abs().max().item()
        print(f"gemma4 vision max abs err fp32: {err:.2e}")
        assert err < 1e-4
        outs.append(ours)
    assert (outs[0][:4] - outs[2][:4]).abs().max().item() > 1e-2  # different pictures, different rows


def _hf_logits(hf: Any, tokens: list[int], ref: dict[str, torch.Tensor]) -> np.ndarray:
    # mm_token_type_ids as Gemma4Processor gives them (1 under the image tokens): with "vision" the
    # picture's sliding-layer rows see each other both ways; without it transformers stays causal
    ids = torch.tensor([tokens])
    with torch.no_grad():
        out = hf(
            input_ids=ids,
            pixel_values=ref["pixel_values"],
            image_position_ids=ref["image_position_ids"],
            mm_token_type_ids=(ids == IMAGE).long(),
        )
    return out.logits[0].float().numpy()


def _picture_prompt(folder: Path, path: Path) -> tuple[list[int], ImageInput]:
    pixels = _ours(folder, path)
    count = load_gemma4_vision(folder).encode(torch.from_numpy(pixels)[None])[0].shape[0]
    prompt = [2, 5, 17, IMAGE_SPECIALS["<|image>"], *[IMAGE] * count, IMAGE_SPECIALS["<image|>"], 42, 7]
    placeholders = tuple(i for i, t in enumerate(prompt) if t == IMAGE)
    return prompt, ImageInput(placeholders, content_hash(path.read_bytes()), pixels)


@pytest.mark.parametrize("chunk", [None, 9])
def test_image_prompt_logits_and_greedy_tokens_match(
    saved: tuple[Any, Path], tmp_path: Path, chunk: int | None
) -> None:
    """The picture's rows scattered at its placeholders give transformers' logits and greedy tokens, whole
    or chunked: in the middle of the image's run for the causal checkpoints, where the scheduler cuts (before
    the picture, then all of it) for the one that sees pictures both ways."""
    hf, folder = saved
    path = pictures(tmp_path)[1]  # the wide JPEG
    ref = _reference(path)
    prompt, image = _picture_prompt(folder, path)
    runner = fp32_runner(load_model(folder))
    both_ways = hf.config.get_text_config().use_bidirectional_attention == "vision"
    assert runner.pictures_both_ways == both_ways
    if chunk is None or not both_ways:
        spans = [(0, len(prompt))] if chunk is None else [(0, chunk), (chunk, len(prompt))]
    else:
        spans = scheduler_chunks(len(prompt), image, chunk)
        run_end = image.placeholders[-1] + 1  # before the picture, then all of it past the chunk size
        assert spans == [(0, 4), (4, run_end), (run_end, len(prompt))]
    driver = PagedDriver(runner)
    theirs = assert_prefill_and_greedy(
        driver,
        prompt,
        spans,
        lambda start, end: prefill_logits(runner, driver, REQ, image, [(start, end)]),
        partial(_hf_logits, hf, ref=ref),
        f"gemma4 (both ways={both_ways})",
        # The image rows carry the tower's ~1e-5 float error through every layer of a random model (a
        # text-only prompt here is at ~6e-6), so the bound is looser than the text suites' 1e-4.
        atol=3e-4,
    )
    # the picture matters: another picture's pixels give other last logits
    other = _reference(pictures(tmp_path)[0])
    other_prompt = [2, 5, 17, 251, *[IMAGE] * int(other["num_soft_tokens_per_image"][0]), 252, 42, 7]
    assert np.abs(theirs[-1] - _hf_logits(hf, other_prompt, other)[-1]).max() > 1e-3


def test_causal_attention_over_the_picture_misses_transformers(
    saved: tuple[Any, Path], tmp_path: Path
) -> None:
    """With "vision", the check above fails on a causal path: the picture masks off, the logits from the
    picture's tokens on are far from transformers' (the rows before it still match)."""
    hf, folder = saved
    if hf.config.get_text_config().use_bidirectional_attention != "vision":
        pytest.skip("a causal checkpoint: transformers attends causally over its pictures too")
    path = pictures(tmp_path)[1]
    prompt, image = _picture_prompt(folder, path)
    runner = fp32_runner(load_model(folder))
    runner.model.pictures_both_ways = False  # type: ignore[assignment]
    driver = PagedDriver(runner)
    driver.add("a", prompt)
    ours = prefill_logits(runner, driver, "a", image, [(0, len(prompt))])
    theirs = _hf_logits(hf, prompt, _reference(path))
    assert np.abs(ours[:4] - theirs[:4]).max() < 3e-4
    err = np.abs(ours[4:] - theirs[4:]).max()
    print(f"gemma4 causal-over-the-picture logits max abs err fp32: {err:.2e}")
    assert err > 1e-2


def test_prompt_expansion_is_the_processors(saved: tuple[Any, Path], tmp_path: Path) -> None:
    """`<|image|>` per picture becomes begin + one image token per soft token + end; the runs pair up with
    their pictures in order, and a broken run is refused."""
    _, folder = saved
    prompt = Gemma4ImagePrompt.from_config(folder, vision_config(folder))  # type: ignore[arg-type]
    assert (prompt.image, prompt.begin, prompt.end, prompt.image_token_id) == (
        "<|image|>",
        "<|image>",
        "<image|>",
        IMAGE,
    )
    paths = pictures(tmp_path)[:2]
    grids = [prompt.grid(prompt.preprocess(decode(p.read_bytes()))) for p in paths]
    expected = [int(_reference(p)["num_soft_tokens_per_image"][0]) for p in paths]
    assert [r * c for r, c in grids] == expected
    text = prompt.expand("a <|image|> b <|image|> c", grids)
    runs = [f"<|image>{'<|image|>' * n}<image|>" for n in expected]
    assert text == f"a {runs[0]} b {runs[1]} c"  # Gemma4Processor.replace_image_token
    ids = list(tokenizer().encode(text, add_special_tokens=False).ids)
    found = prompt.placeholders(ids, grids)
    assert [len(run) for run in found] == expected and found[0][0] == 2
    with pytest.raises(ValueError, match="image slots"):
        prompt.expand("no picture here", grids)
    with pytest.raises(ValueError, match="image tokens"):
        prompt.placeholders(ids[:-5], grids)


def test_target_sizes_match_the_processor_on_any_shape() -> None:
    """The resize arithmetic on random and extreme shapes (one tile row or column, pictures smaller than a
    tile, every budget) equals transformers' get_aspect_ratio_preserving_size."""
    from transformers.models.gemma4.image_processing_pil_gemma4 import get_aspect_ratio_preserving_size

    rng = np.random.default_rng(0)
    shapes = [(int(h), int(w)) for h, w in rng.integers(1, 4000, size=(200, 2))]
    shapes += [(1, 5000), (5000, 1), (3, 3), (47, 48), (10, 30_000), (768, 768), (896, 896)]
    for tokens in (70, 280, 1120):
        spec = Gemma4ImageSpec(max_soft_tokens=tokens)
        for h, w in shapes:
            theirs = get_aspect_ratio_preserving_size(h, w, 16, spec.max_patches, 3)
            assert target_size(h, w, spec) == theirs, (h, w, tokens)
