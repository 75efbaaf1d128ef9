"""LLaVA pictures through the real server and the official openai client (#29): the tiny random
LlavaForConditionalGeneration of tests/helpers/llava_models.py served on the torch backend in float32
with 8-token prefill chunks (the image's 16-token run crosses a chunk boundary), as a safetensors folder
and as llama.cpp's GGUF + mmproj pair (auto-paired beside the model; its reference prompt is tokenized
by the GGUF's own tokenizer, which the converter leaves without our word-level merges). A data: URL picture gets
transformers' greedy answer (pixels from its CLIPImageProcessorPil for the folder; for the pair the same
pixels localchat's padded preprocessing gives), another picture another answer, /v1/models says vision,
and usage.prompt_tokens counts the image tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from tokenizers import Tokenizer
from transformers.models.clip import CLIPImageProcessorPil

from localchat.vision.llava_prompt import LlavaImagePrompt
from localchat.vision.model_info import vision_config
from localchat.weights.loader import load_model
from tests.helpers import llava_models as tiny
from tests.helpers.picture_server import serve_and_assert_answers

pytestmark = pytest.mark.slow

QUESTION = "what is in this picture ?"
MAX_TOKENS = 5


def _hf_answer(hf: Any, tokenizer: Any, pixels: np.ndarray) -> tuple[str, int]:
    # the template's text with <image> expanded as LlavaProcessor does
    text = f"USER: {'<image>' * tiny.TOKENS_PER_IMAGE}\n{QUESTION} ASSISTANT:"
    if isinstance(tokenizer, Tokenizer):
        tokens = list(tokenizer.encode(text, add_special_tokens=False).ids)
    else:  # the GGUF's own tokenizer: the converter stores the word-level vocabulary without merges
        tokens = list(tokenizer.encode(text))
    start = len(tokens)
    with torch.no_grad():
        for _ in range(MAX_TOKENS):
            logits = hf(input_ids=torch.tensor([tokens]), pixel_values=torch.from_numpy(pixels)[None]).logits
            tokens.append(int(logits[0, -1].argmax()))
            if tokens[-1] == 2:
                tokens.pop()
                break
    if isinstance(tokenizer, Tokenizer):
        return str(tokenizer.decode(tokens[start:], skip_special_tokens=True)), start
    return str(tokenizer.decode(tokens[start:])), start


@pytest.mark.parametrize("source", ["folder", "gguf"])
def test_a_picture_answers_as_transformers(source: str, tmp_path: Path) -> None:
    folder = tmp_path / "llava"
    hf = tiny.write_folder(folder)
    tokenizer: Any = Tokenizer.from_file(str(folder / "tokenizer.json"))
    pictures = tiny.pictures(tmp_path)
    if source == "gguf":
        from tests.helpers.llava_gguf import round_to_f16, write_gguf_pair

        round_to_f16(hf)
        hf.save_pretrained(folder)
        model_path, _ = write_gguf_pair(folder, tmp_path / "gguf")
        config = vision_config(model_path)
        assert config is not None
        prompt = LlavaImagePrompt.from_config(model_path, config)
        pixels = [prompt.preprocess(Image.open(p)) for p in pictures]  # padded to a square first
        args = ["--f", str(model_path)]
        tokenizer = load_model(model_path).tokenizer  # the server's: the same ids reach both models
    else:
        processor = CLIPImageProcessorPil(**tiny.PREPROCESSOR)
        pixels = [processor(Image.open(p), return_tensors="np")["pixel_values"][0] for p in pictures]
        args = ["--w", str(folder)]
    expected = [_hf_answer(hf, tokenizer, p) for p in pixels]
    assert expected[0][0] != expected[1][0]  # the picture matters to this model
    args += ["--backend", "torch", "--dtype", "float32", "--mem", "16", "--prefill-chunk-size", "8"]
    serve_and_assert_answers(args, pictures, expected, QUESTION, MAX_TOKENS)
