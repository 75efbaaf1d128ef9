"""Qwen2.5-VL and Qwen3-VL as llama.cpp publishes them, through the real server and the official openai
client (#29): the tiny random checkpoints converted by llama.cpp's convert_hf_to_gguf.py into a text GGUF
and an mmproj beside it (auto-paired), served with `--f model.gguf` on the torch backend in float32 with
8-token prefill chunks (the image's run crosses chunk boundaries). A data: URL picture gets transformers'
greedy answer (the same pixels localchat's preprocessing gives under llama.cpp's pixel bounds, the prompt
tokenized by the GGUF's own tokenizer, as the server does), another picture another answer, /v1/models
says vision, and usage.prompt_tokens counts the image's pads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image

from localchat.vision.model_info import vision_config
from localchat.vision.qwen_vl_prompt import QwenImagePrompt
from localchat.weights.loader import load_model
from tests.helpers import qwen_vl_gguf as pair
from tests.helpers import qwen_vl_models as tiny
from tests.helpers.picture_server import serve_and_assert_answers

pytestmark = pytest.mark.slow

QUESTION = "what is in this picture ?"
MAX_TOKENS = 5


def _hf_answer(
    kind: str, hf: Any, tokenizer: Any, prompt_side: QwenImagePrompt, picture: Path
) -> tuple[str, int]:
    spec = prompt_side.spec
    ref = pair.reference_processor(kind, spec.min_pixels, spec.max_pixels)(
        Image.open(picture), return_tensors="pt"
    )
    pads = int(ref["image_grid_thw"][0].prod()) // 4
    image = f"<|vision_start|>{'<|image_pad|>' * pads}<|vision_end|>"
    tokens = list(tokenizer.encode(f"<|im_start|>user {QUESTION} {image}<|im_end|> <|im_start|>assistant "))
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
            if tokens[-1] == 2:  # the GGUF's end of turn
                tokens.pop()
                break
    return str(tokenizer.decode(tokens[start:])), start


@pytest.mark.parametrize("kind", ["qwen2_5_vl", "qwen3_vl"])
def test_a_picture_answers_as_transformers(kind: str, tmp_path: Path) -> None:
    hf = pair.write_folder(kind, tmp_path / kind)
    model_path, _ = pair.write_gguf_pair(tmp_path / kind, tmp_path / "gguf")
    config = vision_config(model_path)
    assert config is not None
    prompt_side = QwenImagePrompt.from_config(model_path, config)
    tokenizer = load_model(model_path).tokenizer  # the server's: the same ids reach both models
    pictures = pair.pictures(tmp_path)
    expected = [_hf_answer(kind, hf, tokenizer, prompt_side, p) for p in pictures]
    assert expected[0][0] != expected[1][0]  # the picture matters to this model
    args = ["--f", str(model_path), "--backend", "torch", "--dtype", "float32", "--mem", "16"]
    serve_and_assert_answers(
        [*args, "--prefill-chunk-size", "8"], pictures, expected, QUESTION, MAX_TOKENS, text_first=True
    )
