"""Gemma 3's vision tower + projector on MLX (localchat.backends.mlx.vision) and the MLX runner's image
path against transformers, on the tiny random Gemma3ForConditionalGeneration of the torch suite
(tests/backends/test_gemma3_vision.py), float32 on MLX's CPU device: real PNG files go through
localchat's preprocessing; the image embeddings match get_image_features; an image prompt run through
the runner's execute path (image slices as the engine builds them, whole or in the chunks the scheduler
cuts, never inside the picture) gives transformers' logits and greedy tokens with the token_type_ids its processor passes (the picture's
tokens attend to each other both ways), and the picture is encoded once (the encoder cache)."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
torch = pytest.importorskip("torch")

from localchat.backends.mlx.vision.gemma3 import load_gemma3_vision  # noqa: E402
from localchat.engine.request import ImageInput  # noqa: E402
from localchat.vision.gemma3_preprocess import ImageSpec, content_hash, decode, preprocess  # noqa: E402
from localchat.weights.loader import load_model  # noqa: E402
from tests.backends.test_gemma3_multimodal import TEXT  # noqa: E402
from tests.backends.test_gemma3_vision import VISION, _hf_logits, _pictures  # noqa: E402
from tests.helpers import picture_parity as picture  # noqa: E402
from tests.helpers.parity import Driver, mlx_runner  # noqa: E402
from tests.helpers.picture_prefill import scheduler_chunks  # noqa: E402

pytestmark = pytest.mark.mlx

PROMPT = [5, 17, 297, 299, 299, 299, 299, 298, 42, 7]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    """The torch suite's model: the same seed, config and weight scale (large enough that the picture
    moves the logits)."""
    from tokenizers import Tokenizer, models
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    torch.manual_seed(0)
    config = Gemma3Config(
        text_config=TEXT, vision_config=VISION, mm_tokens_per_image=4, image_token_index=299
    )
    hf = Gemma3ForConditionalGeneration(config)
    with torch.no_grad():
        for name, param in hf.named_parameters():
            param.copy_((0.3 if name.endswith("norm.weight") else 0.15) * torch.randn_like(param))
    folder = tmp_path_factory.mktemp("gemma3v-mlx")
    hf.eval().save_pretrained(folder)
    vocab = {f"t{i}": i for i in range(300)}
    (folder / "tokenizer.json").write_text(Tokenizer(models.WordLevel(vocab, unk_token="t0")).to_str())
    return hf, folder


def test_image_embeddings_match_transformers(saved: tuple[Any, Path], tmp_path: Path) -> None:
    hf, folder = saved
    vision = load_gemma3_vision(folder)
    spec = ImageSpec.from_folder(folder, vision.image_size)
    pixels = np.stack([preprocess(decode(b), spec) for b in _pictures(tmp_path)])
    ours = np.array(vision.encode(mx.array(pixels)))
    with torch.no_grad():
        theirs = hf.model.get_image_features(pixel_values=torch.from_numpy(pixels)).pooler_output.numpy()
    assert ours.shape == (2, 4, TEXT["hidden_size"])
    err = np.abs(ours - theirs).max()
    print(f"mlx gemma3 vision max abs err fp32: {err:.2e}")
    assert err < 1e-4
    assert np.abs(ours[0] - ours[1]).max() > 1e-2  # different pictures, different embeddings


@pytest.mark.parametrize("chunk", [None, 5])
def test_image_prompt_logits_and_greedy_tokens_match(
    saved: tuple[Any, Path], tmp_path: Path, chunk: int | None
) -> None:
    """chunk=5 would split the image's four placeholders (positions 3-6): the scheduler stops the first chunk
    before the picture, and the next takes all of it."""
    hf, folder = saved
    data = _pictures(tmp_path)[0]
    pixels = preprocess(decode(data), ImageSpec.from_folder(folder, 56))
    runner = mlx_runner(load_model(folder))
    assert runner.images is not None
    image = ImageInput(tuple(i for i, t in enumerate(PROMPT) if t == 299), content_hash(data), pixels)
    driver = Driver(runner)
    assert runner.pictures_both_ways
    spans = scheduler_chunks(len(PROMPT), image, chunk)
    assert spans == ([(0, 10)] if chunk is None else [(0, 3), (3, 8), (8, 10)])
    torch_pixels = torch.from_numpy(pixels)[None]
    picture.assert_prefill_and_greedy(
        driver,
        PROMPT,
        spans,
        picture.image_slices(driver, image, only_with_rows=True),
        partial(_hf_logits, hf, pixels=torch_pixels),
        "mlx gemma3",
        # the picture matters: without its embeddings the prompt's last logits differ
        without_picture=partial(_hf_logits, hf, pixels=torch.zeros_like(torch_pixels)),
    )
    picture.assert_encoded_once(runner, image, spans)


def test_a_text_only_gemma3_has_no_tower(saved: tuple[Any, Path], tmp_path: Path) -> None:
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    Gemma3ForCausalLM(Gemma3TextConfig(**TEXT)).save_pretrained(tmp_path)
    (tmp_path / "tokenizer.json").write_bytes((saved[1] / "tokenizer.json").read_bytes())
    assert mlx_runner(load_model(tmp_path)).images is None


def test_a_gguf_with_a_paired_mmproj_is_refused_with_the_fix(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A GGUF + llama.cpp mmproj pair takes pictures on the server's side (localchat.vision.mmproj), but
    the MLX tower reads safetensors folders only: the load says which backend runs the pair."""
    from localchat.backends.mlx.vision import images
    from localchat.errors import BackendUnavailableError

    paired = {"model_type": "gemma3", "vision_config": {}, "mmproj": str(tmp_path / "mmproj-x.gguf")}
    monkeypatch.setattr(images, "vision_config", lambda path: paired)
    with pytest.raises(BackendUnavailableError, match=r"mmproj-x\.gguf.*--backend torch"):
        images.load_image_embedder(tmp_path / "x.gguf", mx.float32)
