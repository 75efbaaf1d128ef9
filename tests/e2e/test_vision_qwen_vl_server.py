"""Qwen2.5-VL and Qwen3-VL pictures through the real server and the official openai client (#29): tiny
random checkpoints (transformers' classes, tests/helpers/qwen_vl_models.py) served on the torch backend in
float32 with 8-token prefill chunks (the image run crosses a chunk boundary). A data: URL picture gets
transformers' greedy answer (pixels from its own Qwen2VLImageProcessorPil, pads per the image grid, M-RoPE
positions from its get_rope_index), another picture another answer, and usage.prompt_tokens counts the
image's pads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image

from tests.helpers import qwen_vl_models as tiny
from tests.helpers.picture_server import serve_and_assert_answers

pytestmark = pytest.mark.slow

QUESTION = "what is in this picture ?"
MAX_TOKENS = 5


def _prompt_ids(pads: int) -> list[int]:
    """The template's text with <|image_pad|> expanded as transformers' processor does."""
    image = f"<|vision_start|>{'<|image_pad|>' * pads}<|vision_end|>"
    text = f"<|im_start|>user {QUESTION} {image}<|im_end|> <|im_start|>assistant "
    return list(tiny.tokenizer().encode(text, add_special_tokens=False).ids)


def _hf_answer(kind: str, hf: Any, picture: Path) -> tuple[str, int]:
    ref = tiny.image_processor(kind)(Image.open(picture), return_tensors="pt")
    pads = int(ref["image_grid_thw"][0].prod()) // 4
    tokens = _prompt_ids(pads)
    start = len(tokens)
    with torch.no_grad():
        for _ in range(MAX_TOKENS):
            ids = torch.tensor([tokens])
            logits = hf(
                input_ids=ids,
                pixel_values=ref["pixel_values"],
                image_grid_thw=ref["image_grid_thw"],
                mm_token_type_ids=(ids == tiny.IMAGE).int(),
            ).logits[0, -1]
            tokens.append(int(logits.argmax()))
            if tokens[-1] in (0, 2):
                tokens.pop()
                break
    return str(tiny.tokenizer().decode(tokens[start:], skip_special_tokens=True)), start


@pytest.mark.parametrize("kind", tiny.KINDS)
def test_a_picture_answers_as_transformers(kind: str, tmp_path: Path) -> None:
    folder = tmp_path / kind
    hf = tiny.write_folder(kind, folder)
    pictures = tiny.pictures(tmp_path)
    expected = [_hf_answer(kind, hf, p) for p in pictures]
    assert expected[0][0] != expected[1][0]  # the picture matters to this model
    args = ["--w", str(folder), "--backend", "torch", "--dtype", "float32", "--mem", "16"]
    serve_and_assert_answers(
        [*args, "--prefill-chunk-size", "8"], pictures, expected, QUESTION, MAX_TOKENS, text_first=True
    )
