"""SmolVLM pictures through the real server and the official openai client (#29): the tiny random
SmolVLMForConditionalGeneration of tests/helpers/smolvlm_models.py served on the torch backend in float32
with 8-token prefill chunks (each 16-token tile run crosses chunk boundaries). A data: URL picture gets
transformers' greedy answer, with the prompt built by transformers' own Idefics3Processor (tiles, row/col
markers, global image) and the pixels by SmolVLMImageProcessorPil; another picture another answer;
/v1/models says vision, and usage.prompt_tokens counts the image tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image
from tokenizers import Tokenizer
from transformers import Idefics3Processor, PreTrainedTokenizerFast
from transformers.models.smolvlm import SmolVLMImageProcessorPil

from tests.helpers import smolvlm_models as tiny
from tests.helpers.picture_server import serve_and_assert_answers

pytestmark = pytest.mark.slow

QUESTION = "what is in this picture ?"
MAX_TOKENS = 5
STOP = {2, tiny.vocab()["<end_of_utterance>"]}


def _hf_answer(hf: Any, folder: Path, picture: Path) -> tuple[str, int]:
    processor = Idefics3Processor(
        SmolVLMImageProcessorPil(**tiny.PREPROCESSOR),
        PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json")),
        image_seq_len=tiny.TOKENS_PER_TILE,
    )
    text = f"<|im_start|>User:<image>{QUESTION}<end_of_utterance>\nAssistant:"  # the template's text
    inputs = processor(text=text, images=[Image.open(picture)], return_tensors="pt")
    tokens = [int(t) for t in inputs["input_ids"][0]]
    start = len(tokens)
    with torch.no_grad():
        for _ in range(MAX_TOKENS):
            logits = hf(input_ids=torch.tensor([tokens]), pixel_values=inputs["pixel_values"]).logits
            tokens.append(int(logits[0, -1].argmax()))
            if tokens[-1] in STOP:
                tokens.pop()
                break
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    return str(tokenizer.decode(tokens[start:], skip_special_tokens=True)), start


def test_a_picture_answers_as_transformers(tmp_path: Path) -> None:
    folder = tmp_path / "smolvlm"
    hf = tiny.write_folder(folder)
    pictures = tiny.pictures(tmp_path)
    expected = [_hf_answer(hf, folder, p) for p in pictures]
    assert expected[0][0] != expected[1][0]  # the picture matters to this model
    args = ["--w", str(folder), "--backend", "torch", "--dtype", "float32", "--mem", "16"]
    serve_and_assert_answers([*args, "--prefill-chunk-size", "8"], pictures, expected, QUESTION, MAX_TOKENS)
