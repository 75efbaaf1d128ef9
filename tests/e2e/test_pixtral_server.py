"""Mistral Small 3.x pictures through the real server and the official openai client (#29): the tiny random
Mistral3ForConditionalGeneration of tests/helpers/pixtral_models.py served on the torch backend in float32
with 8-token prefill chunks (each picture's rows of [IMG] + [IMG_BREAK] cross chunk boundaries). A data:
URL picture gets transformers' greedy answer (pixels from its PixtralImageProcessorPil, the prompt
expanded as PixtralProcessor does) twice, the second time from the caches; pictures of other shapes get
other token grids and answers; /v1/models says vision and usage.prompt_tokens counts the image tokens."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
import torch
from PIL import Image
from tokenizers import Tokenizer
from transformers.models.pixtral import PixtralImageProcessorPil

from tests.helpers import pixtral_models as tiny
from tests.helpers.live_server import live_server

pytestmark = pytest.mark.slow

QUESTION = "what is in this picture ?"
MAX_TOKENS = 5


def _expanded(height: int, width: int) -> str:
    """PixtralProcessor.replace_image_token's run for a picture of this size."""
    rows, columns = height // tiny.UNIT, width // tiny.UNIT
    run = ("[IMG]" * columns + "[IMG_BREAK]") * rows
    return run[: -len("[IMG_BREAK]")] + "[IMG_END]"


def _hf_answer(hf: Any, tokenizer: Tokenizer, pixels: np.ndarray) -> tuple[str, int]:
    text = f"<s>[INST]{_expanded(*pixels.shape[1:])} {QUESTION}[/INST]"
    tokens = list(tokenizer.encode(text, add_special_tokens=False).ids)
    start = len(tokens)
    sizes = torch.tensor([list(pixels.shape[1:])])
    with torch.no_grad():
        for _ in range(MAX_TOKENS):
            out = hf(
                input_ids=torch.tensor([tokens]),
                pixel_values=torch.from_numpy(pixels)[None],
                image_sizes=sizes,
            )
            tokens.append(int(out.logits[0, -1].argmax()))
            if tokens[-1] == 2:
                tokens.pop()
                break
    return str(tokenizer.decode(tokens[start:], skip_special_tokens=True)), start


def _data_url(path: Path) -> str:
    mime = "image/png" if path.suffix == ".png" else "image/jpeg"
    return f"data:{mime};base64," + base64.b64encode(path.read_bytes()).decode()


def test_a_picture_answers_as_transformers(tmp_path: Path) -> None:
    folder = tmp_path / "mistral3"
    hf = tiny.write_folder(folder)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    pictures = tiny.pictures(tmp_path)
    processor = PixtralImageProcessorPil(**{**tiny.PREPROCESSOR, "patch_size": tiny.UNIT})
    pixels = [processor(Image.open(p), return_tensors="np")["pixel_values"][0] for p in pictures]
    assert pixels[0].shape != pixels[1].shape  # a wide and a tall picture: different token grids
    expected = [_hf_answer(hf, tokenizer, p) for p in pixels]
    assert expected[0][0] != expected[1][0]  # the picture matters to this model
    args = ["--w", str(folder), "--backend", "torch", "--dtype", "float32", "--mem", "16"]
    with live_server([*args, "--prefill-chunk-size", "8"]) as server:
        client: Any = openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0, timeout=120)
        model = client.models.list().data[0]
        assert (model.model_extra or {})["vision"] is True
        for picture, (answer, prompt_tokens) in zip(pictures, expected, strict=True):
            content = [
                {"type": "image_url", "image_url": {"url": _data_url(picture)}},
                {"type": "text", "text": QUESTION},
            ]
            for _ in range(2):  # the second time from the prefix and encoder caches
                reply = client.chat.completions.create(
                    model=model.id,
                    messages=[{"role": "user", "content": content}],
                    max_tokens=MAX_TOKENS,
                    temperature=0,
                )
                # compared without spaces: the word-level test vocabulary has no decoder
                assert reply.choices[0].message.content.replace(" ", "") == answer.replace(" ", "")
                assert reply.usage.prompt_tokens == prompt_tokens  # the image tokens included
        # bytes that are no image: a 400 naming the part, not a crash
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(
                model=model.id,
                messages=[
                    {
                        "role": "user",
                        "content": [
                            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
                        ],
                    }
                ],
                max_tokens=1,
            )
