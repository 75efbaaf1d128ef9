"""Mistral Small 3.x pictures through the real server and the official openai client (#29): the tiny random
Mistral3ForConditionalGeneration of tests/helpers/pixtral_models.py served on the torch backend in float32
with 8-token prefill chunks (each picture's rows of [IMG] + [IMG_BREAK] cross chunk boundaries). A data:
URL picture gets transformers' greedy answer (pixels from its PixtralImageProcessorPil, the prompt
expanded as PixtralProcessor does) twice, the second time from the caches; pictures of other shapes get
other token grids and answers; /v1/models says vision and usage.prompt_tokens counts the image tokens."""

from __future__ import annotations

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
from tests.helpers.picture_server import assert_answers, vision_client

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
    with vision_client([*args, "--prefill-chunk-size", "8"]) as (client, model):
        assert_answers(client, model, pictures, expected, QUESTION, MAX_TOKENS)
        # bytes that are no image: a 400 naming the part, not a crash
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(
                model=model,
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
