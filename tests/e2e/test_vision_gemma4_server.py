"""Gemma 4 pictures through the real server and the official openai client (#29): a tiny random
Gemma4ForConditionalGeneration (text LM + vision tower + embedder, no audio) saved as a safetensors folder
(tests/helpers/gemma4_vision_models.py), served on the torch backend in float32.

A picture sent as a data URL gets transformers' greedy tokens for the same picture and prompt (pixels and
patch positions from transformers' own Gemma 4 image processor, token ids from the tokenizer on the
processor's expanded text: `<|image>` + one `<|image|>` per soft token + `<image|>`); pictures of other
shapes get other token counts, and usage.prompt_tokens counts them; the model card says it takes images;
a second turn about the same picture (the encoder and prefix caches) answers the same, streamed."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import torch
from PIL import Image

from tests.helpers.gemma4_vision_models import SPECIALS, image_processor, pictures, tokenizer, write_folder
from tests.helpers.live_server import LiveServer, live_server

pytestmark = pytest.mark.slow

QUESTION = "what ?"  # short: the picture weighs more in a tiny random model
MAX_TOKENS = 6


def _data_url(path: Path) -> str:
    mime = "image/png" if path.suffix == ".png" else "image/jpeg"
    return f"data:{mime};base64," + base64.b64encode(path.read_bytes()).decode()


def _prompt_ids(soft_tokens: int) -> list[int]:
    """The token ids transformers' Gemma4Processor would give: `<|image|>` expanded in the text."""
    image = f"<|image>{'<|image|>' * soft_tokens}<image|>"
    text = f"<bos><start_of_turn>user {QUESTION} {image}<end_of_turn> <start_of_turn>model "
    return list(tokenizer().encode(text, add_special_tokens=False).ids)


def _hf_answer(hf: Any, picture: Path) -> tuple[str, int]:
    """transformers' greedy answer and the prompt's length."""
    ref = image_processor()(Image.open(picture), return_tensors="pt")
    tokens = _prompt_ids(int(ref["num_soft_tokens_per_image"][0]))
    start = len(tokens)
    with torch.no_grad():
        for _ in range(MAX_TOKENS):
            # no mm_token_type_ids: causal attention over the image, as localchat's paged attention runs it
            logits = hf(
                input_ids=torch.tensor([tokens]),
                pixel_values=ref["pixel_values"],
                image_position_ids=ref["image_position_ids"],
            ).logits[0, -1]
            tokens.append(int(logits.argmax()))
            if tokens[-1] == SPECIALS["<eos>"]:
                tokens.pop()
                break
    return str(tokenizer().decode(tokens[start:], skip_special_tokens=True)), start


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    path = tmp_path_factory.mktemp("gemma4-vision-tiny")
    return write_folder(path), path


@pytest.fixture(scope="module")
def server(folder: tuple[Any, Path]) -> Iterator[LiveServer]:
    args = ["--w", str(folder[1]), "--backend", "torch", "--dtype", "float32", "--mem", "16"]
    with live_server(args) as s:
        yield s


@pytest.fixture(scope="module")
def client(server: LiveServer) -> Any:  # Any: the tests pass plain dicts where the SDK types TypedDicts
    return openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0, timeout=120)


def _ask(url: str) -> list[dict[str, Any]]:
    content = [{"type": "text", "text": QUESTION}, {"type": "image_url", "image_url": {"url": url}}]
    return [{"role": "user", "content": content}]


def test_a_picture_answers_as_transformers(client: Any, folder: tuple[Any, Path], tmp_path: Path) -> None:
    hf, _ = folder
    paths = pictures(tmp_path)[:2]  # a PNG and a wide JPEG
    expected = [_hf_answer(hf, p) for p in paths]
    assert expected[0][0] != expected[1][0]  # the picture matters to this model
    assert expected[0][1] != expected[1][1]  # and its shape sets its token count
    model = client.models.list().data[0]
    assert (model.model_extra or {})["vision"] is True
    for path, (answer, prompt_tokens) in zip(paths, expected, strict=True):
        reply = client.chat.completions.create(
            model=model.id, messages=_ask(_data_url(path)), max_tokens=MAX_TOKENS, temperature=0
        )
        assert reply.choices[0].message.content == answer
        assert reply.usage.prompt_tokens == prompt_tokens  # the soft tokens and the markers count
    stream = client.chat.completions.create(
        model=model.id,
        messages=_ask(_data_url(paths[0])),
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected[0][0]
    assert chunks[-1].usage.prompt_tokens == expected[0][1]
