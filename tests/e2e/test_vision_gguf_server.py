"""A Gemma 3 GGUF with llama.cpp's mmproj beside it through the real server and the official openai client
(#29): `--f model.gguf` alone pairs the projector, /v1/models says the model sees images, and a picture
sent as a data URL gets transformers' greedy answer. Both files are written by llama.cpp's converter from
the tiny random Gemma 3 vision checkpoint of test_vision_server.py. The GGUF's tokenizer is rebuilt from
the file (the converter stores our word-level vocabulary without merges), so the reference prompt is the
same rendered text tokenized by that tokenizer, and its greedy tokens are decoded by it too."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
import torch
from PIL import Image
from transformers.models.gemma3 import Gemma3ImageProcessorPil

from localchat.weights.loader import load_model
from tests.backends.test_gemma3_mmproj import round_projection_to_f16
from tests.e2e.test_vision_server import (
    MAX_TOKENS,
    QUESTION,
    SIZE,
    SPECIALS,
    TOKENS_PER_IMAGE,
    _ask,
    _data_url,
    _write_folder,
)
from tests.helpers.gemma3_gguf_vision import write_gguf_pair
from tests.helpers.live_server import LiveServer, live_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    folder = tmp_path_factory.mktemp("gemma3-vision-folder")
    hf = _write_folder(folder, query_pre_attn_scalar=16)  # llama.cpp's gemma3 scales by head_dim**-0.5
    round_projection_to_f16(hf, folder)  # the converter stores the projector matrix in f16
    model, _ = write_gguf_pair(folder, tmp_path_factory.mktemp("gemma3-vision-gguf"), TOKENS_PER_IMAGE)
    return hf, model


@pytest.fixture(scope="module")
def server(gguf: tuple[Any, Path]) -> Iterator[LiveServer]:
    args = ["--f", str(gguf[1]), "--backend", "torch", "--dtype", "float32", "--mem", "16"]
    with live_server(args) as s:
        yield s


def _pictures(folder: Path) -> list[Path]:
    """A black and a white picture: with the words the GGUF tokenizer drops, this tiny model's first-token
    probability turns on these two (its greedy words do not, once a picture's tokens attend both ways)."""
    paths = []
    for value in (0, 255):
        path = folder / f"flat{value}.png"
        Image.fromarray(np.full((40, 70, 3), value, dtype=np.uint8), "RGB").save(path)
        paths.append(path)
    return paths


def _hf_answer(hf: Any, model: Path, picture: Path) -> tuple[str, float]:
    """Transformers' greedy answer and its first token's logprob (the tiny model's words turn on the picture
    only in their probabilities once the picture's tokens attend both ways)."""
    tokenizer = load_model(model).tokenizer
    image = f"\n\n<start_of_image>{'<image_soft_token>' * TOKENS_PER_IMAGE}<end_of_image>\n\n"
    text = f"<bos><start_of_turn>user {QUESTION} {image}<end_of_turn> <start_of_turn>model "
    tokens = tokenizer.encode(text, add_special_tokens=False)
    assert tokens.count(299) == TOKENS_PER_IMAGE
    pixels = Gemma3ImageProcessorPil(size={"height": SIZE, "width": SIZE})(
        Image.open(picture), return_tensors="pt"
    )["pixel_values"]
    start = len(tokens)
    first_logprob = 0.0
    with torch.no_grad():
        for _ in range(MAX_TOKENS):
            # token_type_ids as Gemma3Processor gives them: the picture's tokens see each other both ways
            ids = torch.tensor([tokens])
            types = (ids == 299).long()
            logits = hf(input_ids=ids, pixel_values=pixels, token_type_ids=types).logits[0, -1]
            tokens.append(int(logits.argmax()))
            if len(tokens) == start + 1:
                first_logprob = float(torch.log_softmax(logits.double(), -1)[tokens[-1]])
            if tokens[-1] == SPECIALS["<eos>"]:
                tokens.pop()
                break
    return tokenizer.decode(tokens[start:], skip_special_tokens=True), first_logprob


def test_a_gguf_with_its_mmproj_answers_a_picture_as_transformers(
    server: LiveServer, gguf: tuple[Any, Path], tmp_path: Path
) -> None:
    hf, model_file = gguf
    client: Any = openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0, timeout=120)
    model = client.models.list().data[0]
    assert (model.model_extra or {})["vision"] is True
    pictures = _pictures(tmp_path)
    expected = [_hf_answer(hf, model_file, p) for p in pictures]
    assert abs(expected[0][1] - expected[1][1]) > 1e-3  # the picture matters to this model
    for picture, (answer, first_logprob) in zip(pictures, expected, strict=True):
        reply = client.chat.completions.create(
            model=model.id,
            messages=_ask(_data_url(picture)),
            max_tokens=MAX_TOKENS,
            temperature=0,
            logprobs=True,
        )
        assert reply.choices[0].message.content == answer
        assert abs(reply.choices[0].logprobs.content[0].logprob - first_logprob) < 1e-3
