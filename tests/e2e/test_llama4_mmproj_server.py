"""A Llama 4 GGUF + llama.cpp's `llama4` mmproj through the real server and the official openai client (#29):
both written by llama.cpp's own converter from the tiny random Llama4ForConditionalGeneration
(tests/helpers/llama4_gguf.py), the mmproj paired because it is the only one beside the model, served on
torch in float32 with 8-token prefill chunks. A data: URL picture gets transformers' greedy answer for the
tokens the GGUF's own tokenizer gives the prompt; another picture another answer; /v1/models says vision."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image

from localchat.vision.llama4_prompt import Llama4ImagePrompt
from localchat.vision.model_info import vision_config
from localchat.weights.loader import load_model
from tests.helpers import llama4_vision_models as tiny
from tests.helpers.llama4_gguf import write_folder, write_gguf_pair
from tests.helpers.picture_server import serve_and_assert_answers

pytestmark = pytest.mark.slow

QUESTION = "?"  # one character: the converted word-level test vocabulary spells no longer word
MAX_TOKENS = 5
STOP = 2  # <|eot|>


def _hf_greedy(hf: Any, tokens: list[int], pixels: torch.Tensor) -> list[int]:
    """Llama4ForConditionalGeneration.forward's steps (its 5.24 forward fails building its output)."""
    tokens = list(tokens)
    start = len(tokens)
    with torch.no_grad():
        features = hf.get_image_features(pixel_values=pixels).last_hidden_state
        rows = hf.multi_modal_projector(features.reshape(-1, features.shape[-1]))
        for _ in range(MAX_TOKENS):
            ids = torch.tensor([tokens])
            embeds = hf.get_input_embeddings()(ids)
            mask = (ids == hf.config.image_token_id)[..., None].expand_as(embeds)
            embeds = embeds.masked_scatter(mask, rows)
            tokens.append(int(hf.language_model(inputs_embeds=embeds).logits[0, -1].argmax()))
            if tokens[-1] == STOP:
                tokens.pop()
                break
    return tokens[start:]


def test_gguf_pair_answers_a_picture_as_transformers(tmp_path: Path) -> None:
    hf = write_folder(tmp_path / "llama4")
    model_file, _ = write_gguf_pair(tmp_path / "llama4", tmp_path / "gguf")
    config = vision_config(model_file)
    assert config is not None
    side = Llama4ImagePrompt.from_config(model_file, config)
    tokenizer = load_model(model_file).tokenizer
    pictures = tiny.pictures(tmp_path)[:2]  # 2 x 3 and 3 x 2 tiles + the global image
    expected = []
    for picture in pictures:
        pixels, tiles = side.preprocess(Image.open(picture))
        text = side.expand(
            "<|begin_of_text|><|header_start|>user<|header_end|> <|image|>"
            f"{QUESTION}<|eot|> <|header_start|>assistant<|header_end|> ",
            [tiles],
        )
        prompt = list(tokenizer.encode(text))
        greedy = _hf_greedy(hf, prompt, torch.from_numpy(pixels))
        expected.append((tokenizer.decode(greedy), len(prompt)))
    assert expected[0][0] != expected[1][0]  # the picture matters to this model
    args = ["--f", str(model_file), "--backend", "torch", "--dtype", "float32", "--mem", "16"]
    serve_and_assert_answers(
        [*args, "--prefill-chunk-size", "8"], pictures, expected, QUESTION, MAX_TOKENS, turns=1, exact=True
    )
