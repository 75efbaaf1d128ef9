"""Llama 4 pictures through the real server and the official openai client (#29): the tiny random
Llama4ForConditionalGeneration of tests/helpers/llama4_vision_models.py served on the torch backend in
float32 with 8-token prefill chunks (each 16-token tile run crosses chunk boundaries). A data: URL picture
gets transformers' greedy answer, with the prompt built from Llama4Processor's own image string and the
pixels from transformers' Llama4ImageProcessor (torchvision-only: without it, localchat's preprocessing,
which tests/backends/test_llama4_vision.py proves bit-equal to it); another picture another answer;
/v1/models says vision, and usage.prompt_tokens counts the image tokens."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import torch
from PIL import Image
from tokenizers import Tokenizer
from transformers.models.llama4.processing_llama4 import Llama4Processor

from localchat.vision.llama4_preprocess import Llama4ImageSpec, preprocess_llama4
from tests.helpers import llama4_vision_models as tiny
from tests.helpers.picture_server import serve_and_assert_answers

pytestmark = pytest.mark.slow

QUESTION = "what is in this picture ?"
MAX_TOKENS = 5
STOP = {2}  # <|eot|>


def _pixels(picture: Path) -> tuple[torch.Tensor, tuple[int, int]]:
    if importlib.util.find_spec("torchvision") is not None:
        from transformers import Llama4ImageProcessor

        out = Llama4ImageProcessor(**tiny.PREPROCESSOR)(Image.open(picture), return_tensors="pt")
        rows, cols = (int(v) for v in out["aspect_ratios"][0])
        return out["pixel_values"].float(), (rows, cols)
    pixels, tiles = preprocess_llama4(Image.open(picture), Llama4ImageSpec.from_dict(tiny.PREPROCESSOR))
    return torch.from_numpy(np.ascontiguousarray(pixels)), tiles


def _hf_logits(hf: Any, tokens: list[int], pixels: torch.Tensor) -> torch.Tensor:
    """Llama4ForConditionalGeneration.forward's steps (its 5.24 forward fails building its output)."""
    ids = torch.tensor([tokens])
    with torch.no_grad():
        features = hf.get_image_features(pixel_values=pixels).last_hidden_state
        rows = hf.multi_modal_projector(features.reshape(-1, features.shape[-1]))
        embeds = hf.get_input_embeddings()(ids)
        mask = (ids == hf.config.image_token_id)[..., None].expand_as(embeds)
        embeds = embeds.masked_scatter(mask, rows)
        return cast(torch.Tensor, hf.language_model(inputs_embeds=embeds).logits[0, -1])


def _hf_answer(hf: Any, folder: Path, picture: Path) -> tuple[str, int]:
    pixels, tiles = _pixels(picture)
    image = Llama4Processor._prompt_split_image(cast(Any, None), tiles, tiny.TOKENS_PER_TILE)
    text = (  # the template's text, the picture's <|image|> replaced as the processor does
        f"<|begin_of_text|><|header_start|>user<|header_end|> {image}{QUESTION}<|eot|> "
        "<|header_start|>assistant<|header_end|> "
    )
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokens = list(tokenizer.encode(text).ids)
    start = len(tokens)
    for _ in range(MAX_TOKENS):
        tokens.append(int(_hf_logits(hf, tokens, pixels).argmax()))
        if tokens[-1] in STOP:
            tokens.pop()
            break
    return str(tokenizer.decode(tokens[start:], skip_special_tokens=True)), start


def test_a_picture_answers_as_transformers(tmp_path: Path) -> None:
    folder = tmp_path / "llama4"
    hf = tiny.write_folder(folder)
    pictures = tiny.pictures(tmp_path)[:2]  # 2 x 3 and 3 x 2 tiles + the global image
    expected = [_hf_answer(hf, folder, p) for p in pictures]
    assert expected[0][0] != expected[1][0]  # the picture matters to this model
    args = ["--w", str(folder), "--backend", "torch", "--dtype", "float32", "--mem", "16"]
    serve_and_assert_answers([*args, "--prefill-chunk-size", "8"], pictures, expected, QUESTION, MAX_TOKENS)
