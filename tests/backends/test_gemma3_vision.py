"""Gemma 3's vision tower + projector (localchat.backends.torch.vision.gemma3) against transformers on a
tiny random Gemma3ForConditionalGeneration saved as a safetensors folder, fp32: real PNG files go through
localchat's preprocessing, and the image embeddings match get_image_features; different pictures give
different embeddings; a prompt with a picture gives transformers' logits and greedy tokens with the
token_type_ids its processor passes (the picture's tokens attend to each other both ways), whole or in the
scheduler's chunks, and a causal path over the picture does not."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from tokenizers import Tokenizer, models
from transformers import Gemma3Config, Gemma3ForConditionalGeneration

from localchat.backends.torch.vision.gemma3 import load_gemma3_vision
from localchat.engine.request import ImageInput
from localchat.vision.gemma3_preprocess import ImageSpec, content_hash, decode, preprocess
from localchat.weights.loader import load_model
from tests.backends.test_gemma3_multimodal import TEXT
from tests.helpers.picture_parity import REQ, assert_prefill_and_greedy
from tests.helpers.picture_prefill import prefill_logits, scheduler_chunks
from tests.helpers.torch_batch import PagedDriver
from tests.helpers.torch_models import fp32_runner

VISION = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "image_size": 56,
    "patch_size": 14,
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Path]:
    torch.manual_seed(0)
    config = Gemma3Config(
        text_config=TEXT, vision_config=VISION, mm_tokens_per_image=4, image_token_index=299
    )
    hf = Gemma3ForConditionalGeneration(config)
    with torch.no_grad():
        for name, param in hf.named_parameters():
            param.copy_((0.3 if name.endswith("norm.weight") else 0.15) * torch.randn_like(param))
    folder = tmp_path_factory.mktemp("gemma3v")
    hf.eval().save_pretrained(folder)
    vocab = {f"t{i}": i for i in range(300)}
    (folder / "tokenizer.json").write_text(Tokenizer(models.WordLevel(vocab, unk_token="t0")).to_str())
    return hf, folder


def _pictures(folder: Path) -> list[bytes]:
    rng = np.random.default_rng(1)
    out = []
    for i, shape in enumerate(((40, 70, 3), (90, 33, 3))):
        path = folder / f"p{i}.png"
        Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), "RGB").save(path)
        out.append(path.read_bytes())
    return out


def test_image_embeddings_match_transformers(saved: tuple[torch.nn.Module, Path], tmp_path: Path) -> None:
    hf, folder = saved
    vision = load_gemma3_vision(folder)
    spec = ImageSpec.from_folder(folder, vision.image_size)
    pixels = torch.from_numpy(np.stack([preprocess(decode(b), spec) for b in _pictures(tmp_path)]))
    ours = vision.encode(pixels)
    with torch.no_grad():
        theirs = hf.model.get_image_features(pixel_values=pixels).pooler_output
    assert ours.shape == (2, 4, TEXT["hidden_size"])
    err = (ours - theirs).abs().max().item()
    print(f"gemma3 vision max abs err fp32: {err:.2e}")
    assert err < 1e-4
    assert (ours[0] - ours[1]).abs().max().item() > 1e-2  # different pictures, different embeddings


def _hf_logits(hf: torch.nn.Module, tokens: list[int], pixels: torch.Tensor) -> np.ndarray:
    # token_type_ids as Gemma3Processor gives them (1 under the image tokens): the picture's tokens attend
    # to each other both ways, as localchat's runner attends over them (picture_attention.py)
    ids = torch.tensor([tokens])
    with torch.no_grad():
        return (
            hf(input_ids=ids, pixel_values=pixels, token_type_ids=(ids == 299).long())
            .logits[0]
            .float()
            .numpy()
        )


PROMPT = [5, 17, 297, 299, 299, 299, 299, 298, 42, 7]


@pytest.mark.parametrize("chunk", [None, 6, 4])
def test_image_prompt_logits_and_greedy_tokens_match(
    saved: tuple[torch.nn.Module, Path], tmp_path: Path, chunk: int | None
) -> None:
    """The picture's embeddings scattered at its placeholders, its tokens attending to each other both ways,
    give transformers' logits and greedy tokens: whole, or chunked where the scheduler cuts (a chunk size
    of 6 would end inside the picture: that chunk stops before it; 4 takes it whole past the size)."""
    hf, folder = saved
    data = _pictures(tmp_path)[0]
    pixels = preprocess(decode(data), ImageSpec.from_folder(folder, 56))
    image = ImageInput(tuple(i for i, t in enumerate(PROMPT) if t == 299), content_hash(data), pixels)
    spans = scheduler_chunks(len(PROMPT), image, chunk)
    assert spans == {None: [(0, 10)], 6: [(0, 3), (3, 9), (9, 10)], 4: [(0, 3), (3, 7), (7, 10)]}[chunk]
    runner = fp32_runner(load_model(folder))
    assert runner.pictures_both_ways
    driver = PagedDriver(runner)
    torch_pixels = torch.from_numpy(pixels)[None]
    assert_prefill_and_greedy(
        driver,
        PROMPT,
        spans,
        lambda start, end: prefill_logits(runner, driver, REQ, image, [(start, end)]),
        partial(_hf_logits, hf, pixels=torch_pixels),
        "gemma3",
        # the picture matters: without its embeddings the prompt's last logits differ
        without_picture=partial(_hf_logits, hf, pixels=torch.zeros(1, *pixels.shape)),
    )


def test_causal_attention_over_the_picture_misses_transformers(
    saved: tuple[torch.nn.Module, Path], tmp_path: Path
) -> None:
    """The check above fails on a causal path: with the picture masks off, the logits from the picture's
    tokens on are far from transformers' (the rows before it still match)."""
    hf, folder = saved
    data = _pictures(tmp_path)[0]
    pixels = preprocess(decode(data), ImageSpec.from_folder(folder, 56))
    image = ImageInput((3, 4, 5, 6), content_hash(data), pixels)
    runner = fp32_runner(load_model(folder))
    runner.model.pictures_both_ways = False  # type: ignore[assignment]
    assert not runner.pictures_both_ways
    driver = PagedDriver(runner)
    driver.add("a", PROMPT)
    ours = prefill_logits(runner, driver, "a", image, [(0, len(PROMPT))])
    theirs = _hf_logits(hf, PROMPT, torch.from_numpy(pixels)[None])
    assert np.abs(ours[:3] - theirs[:3]).max() < 1e-4
    err = np.abs(ours[3:] - theirs[3:]).max()
    print(f"gemma3 causal-over-the-picture logits max abs err fp32: {err:.2e}")
    assert err > 1e-2
