"""Gemma 3's vision tower + projector (localchat.backends.torch.vision.gemma3) against transformers on a
tiny random Gemma3ForConditionalGeneration saved as a safetensors folder, fp32: real PNG files go through
localchat's preprocessing, and the image embeddings match get_image_features; different pictures give
different embeddings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from tokenizers import Tokenizer, models
from transformers import Gemma3Config, Gemma3ForConditionalGeneration

from localchat.backends.torch.vision.gemma3 import load_gemma3_vision
from localchat.vision.gemma3_preprocess import ImageSpec, decode, preprocess
from localchat.vision.placement import chunk_rows
from localchat.weights.loader import load_model
from tests.backends.test_gemma3_multimodal import TEXT
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
    # no token_type_ids: causal attention over the image too, as localchat's paged attention runs it
    with torch.no_grad():
        return hf(input_ids=torch.tensor([tokens]), pixel_values=pixels).logits[0].float().numpy()


@pytest.mark.parametrize("chunk", [None, 6])
def test_image_prompt_logits_and_greedy_tokens_match(
    saved: tuple[torch.nn.Module, Path], tmp_path: Path, chunk: int | None
) -> None:
    """The embeddings scattered at the placeholders of a prefill (whole, or split by chunked prefill in
    the middle of the image's run) give transformers' logits and greedy tokens."""
    hf, folder = saved
    vision = load_gemma3_vision(folder)
    pixels = torch.from_numpy(preprocess(decode(_pictures(tmp_path)[0]), ImageSpec.from_folder(folder, 56)))[
        None
    ]
    embeds = vision.encode(pixels)[0]  # encoded once, whole
    prompt = [5, 17, 297, 299, 299, 299, 299, 298, 42, 7]
    placeholders = [i for i, t in enumerate(prompt) if t == vision.image_token_id]
    runner = fp32_runner(load_model(folder))
    model = runner.model
    driver = PagedDriver(runner)
    driver.add("a", prompt)
    rows_logits = []
    for start, end in [(0, len(prompt))] if chunk is None else [(0, chunk), (chunk, len(prompt))]:
        rows, picked = chunk_rows(placeholders, start, end)
        model.image_embeds = (torch.tensor(rows), embeds[picked])
        _, logits = driver.step_logits({"a": end - start}, every_token=True)
        rows_logits.append(logits.cpu().numpy())
    model.image_embeds = None
    ours = np.concatenate(rows_logits)
    theirs = _hf_logits(hf, prompt, pixels)
    err = np.abs(ours - theirs).max()
    print(f"gemma3 image prompt logits max abs err fp32 (chunk={chunk}): {err:.2e}")
    assert err < 1e-4
    for _ in range(3):  # greedy decode after the image
        driver.feed("a", int(ours[-1].argmax()))
        _, logits = driver.step_logits()
        ours = logits.cpu().numpy()
        assert int(ours[0].argmax()) == int(_hf_logits(hf, driver.tokens("a"), pixels)[-1].argmax())
    # the picture matters: without its embeddings the prompt's last logits differ
    assert np.abs(theirs[-1] - _hf_logits(hf, prompt, torch.zeros_like(pixels))[-1]).max() > 1e-3
