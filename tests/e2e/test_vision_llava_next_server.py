"""LLaVA-NeXT pictures through the real server and the official openai client (#29): the tiny random
LlavaNextForConditionalGeneration of tests/helpers/llava_next_models.py served on the torch backend in
float32 with 8-token prefill chunks, as a safetensors folder and as llama.cpp's GGUF + LLaVA-NeXT mmproj
pair (auto-paired beside the model; its reference ids come from the GGUF's own tokenizer, which the
converter leaves without our word-level merges). Pictures of different shapes (so different tile grids and token
counts) as data: URLs get transformers' greedy answer (prompt built and pixels made by its
LlavaNextProcessor), twice each (the second time from the caches), /v1/models says vision, and
usage.prompt_tokens counts the image tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image
from transformers import LlavaNextProcessor, PreTrainedTokenizerFast
from transformers.models.llava_next import LlavaNextImageProcessorPil

from tests.helpers import llava_next_models as tiny
from tests.helpers.picture_server import serve_and_assert_answers

pytestmark = pytest.mark.slow

QUESTION = "what is in this picture ?"
MAX_TOKENS = 5


def _hf_answer(hf: Any, processor: Any, picture: Path, gguf_tokenizer: Any = None) -> tuple[str, int]:
    # the chat template's text for one picture and the question
    text = f"USER: <image>\n{QUESTION} ASSISTANT:"
    inputs = processor(text=text, images=Image.open(picture), add_special_tokens=False, return_tensors="pt")
    tokens = inputs["input_ids"][0].tolist()
    if gguf_tokenizer is not None:  # the same expanded text through the server's own tokenizer
        expanded = processor.tokenizer.decode(tokens).replace("<image> ", "<image>")
        tokens = list(gguf_tokenizer.encode(expanded))
    start = len(tokens)
    with torch.no_grad():
        for _ in range(MAX_TOKENS):
            logits = hf(
                input_ids=torch.tensor([tokens]),
                pixel_values=inputs["pixel_values"],
                image_sizes=inputs["image_sizes"],
            ).logits
            tokens.append(int(logits[0, -1].argmax()))
            if tokens[-1] == 2:
                tokens.pop()
                break
    if gguf_tokenizer is not None:
        return str(gguf_tokenizer.decode(tokens[start:])), start
    return str(processor.tokenizer.decode(tokens[start:], skip_special_tokens=True)), start


@pytest.mark.parametrize("source", ["folder", "gguf"])
def test_pictures_answer_as_transformers(source: str, tmp_path: Path) -> None:
    folder = tmp_path / "llava-next"
    hf = tiny.write_folder(folder)
    args = ["--w", str(folder)]
    gguf_tokenizer = None
    if source == "gguf":
        from localchat.weights.loader import load_model
        from tests.helpers.llava_gguf import round_to_f16
        from tests.helpers.llava_next_gguf import write_next_gguf_pair

        round_to_f16(hf)
        hf.save_pretrained(folder)
        model_path, _ = write_next_gguf_pair(folder, tmp_path / "gguf")
        args = ["--f", str(model_path)]
        gguf_tokenizer = load_model(model_path).tokenizer
    processor = LlavaNextProcessor(
        image_processor=LlavaNextImageProcessorPil(**tiny.PREPROCESSOR),
        tokenizer=PreTrainedTokenizerFast.from_pretrained(folder),
        patch_size=tiny.VISION["patch_size"],
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
    )
    pictures = tiny.pictures(tmp_path)[:3]
    expected = [_hf_answer(hf, processor, p, gguf_tokenizer) for p in pictures]
    assert len({answer for answer, _ in expected}) > 1  # the picture matters to this model
    assert len({count for _, count in expected}) == 3  # three tile grids, three prompt lengths
    args += ["--backend", "torch", "--dtype", "float32", "--mem", "16"]
    serve_and_assert_answers([*args, "--prefill-chunk-size", "8"], pictures, expected, QUESTION, MAX_TOKENS)
