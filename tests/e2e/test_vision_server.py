"""Pictures through the real server and the official openai client (#29): a tiny random Gemma 3 vision
checkpoint (Gemma3ForConditionalGeneration, SigLIP tower + projector) saved as a safetensors folder with
a word-level tokenizer and a Gemma-style chat template, served on the torch backend in float32.

A picture sent as a data URL gets transformers' greedy tokens for the same picture and prompt (pixels
from transformers' own Gemma 3 image processor, token ids from the tokenizer on the processor's expanded
text), streamed and not, on Chat Completions and on the Responses API; another picture another answer;
usage.prompt_tokens counts the image tokens. An http image URL without --allow-image-urls and a
text-only model (SmolLM2) with a picture get OpenAI-style 400s naming the fix."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
import torch
from PIL import Image
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import Gemma3Config, Gemma3ForConditionalGeneration
from transformers.models.gemma3 import Gemma3ImageProcessorPil

from tests.backends.test_gemma3_multimodal import TEXT
from tests.backends.test_gemma3_vision import VISION
from tests.helpers.live_server import LiveServer, live_server

pytestmark = pytest.mark.slow

TOKENS_PER_IMAGE = 4
SPECIALS = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<start_of_turn>": 3, "<end_of_turn>": 4}
IMAGE_SPECIALS = {"<start_of_image>": 297, "<end_of_image>": 298, "<image_soft_token>": 299}
WORDS = ["user", "model", "what", "is", "in", "this", "picture", "?"]
# Gemma's turn layout in a few lines (the real template adds system-prompt folding we do not need here).
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }} "
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for p in m['content'] %}"
    "{% if p['type'] == 'image' %}<start_of_image>{% else %}{{ p['text'] }} {% endif %}{% endfor %}{% endif %}"
    "<end_of_turn> {% endfor %}{% if add_generation_prompt %}<start_of_turn>model {% endif %}"
)
QUESTION = "what ?"  # short: the picture weighs more in a tiny random model
MAX_TOKENS = 6
SIZE = VISION["image_size"]


def _tokenizer() -> Tokenizer:
    vocab = {**SPECIALS, **{w: 5 + i for i, w in enumerate(WORDS)}}
    vocab |= {f"w{i}": i for i in range(5 + len(WORDS), 297)} | IMAGE_SPECIALS
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens([*SPECIALS, *IMAGE_SPECIALS])
    return tok


def _write_folder(folder: Path, **text: Any) -> torch.nn.Module:
    """`text`: text_config overrides (the GGUF tests set what llama.cpp's gemma3 arch fixes)."""
    torch.manual_seed(0)
    config = Gemma3Config(
        text_config={**TEXT, "sliding_window": 64, **text},  # every layer sees the picture
        vision_config=VISION,
        mm_tokens_per_image=TOKENS_PER_IMAGE,
        image_token_index=299,
        boi_token_index=297,
        eoi_token_index=298,
    )
    hf = Gemma3ForConditionalGeneration(config)
    with torch.no_grad():  # weights large enough that the picture moves the logits (as in tests/backends)
        for name, param in hf.named_parameters():
            param.copy_((0.3 if name.endswith("norm.weight") else 0.15) * torch.randn_like(param))
    hf.eval().save_pretrained(folder)
    _tokenizer().save(str(folder / "tokenizer.json"))
    special = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"}
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE, **special}))
    Gemma3ImageProcessorPil(size={"height": SIZE, "width": SIZE}).save_pretrained(folder)
    return hf


def _pictures(folder: Path) -> list[Path]:
    rng = np.random.default_rng(1)
    paths = []
    for i, (shape, fmt) in enumerate((((40, 70, 3), "png"), ((90, 33, 3), "jpeg"))):
        path = folder / f"picture{i}.{fmt}"
        Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), "RGB").save(path)
        paths.append(path)
    return paths


def _data_url(path: Path) -> str:
    mime = "image/png" if path.suffix == ".png" else "image/jpeg"
    return f"data:{mime};base64," + base64.b64encode(path.read_bytes()).decode()


def _prompt_ids() -> list[int]:
    """The token ids transformers' Gemma3Processor would give: <start_of_image> expanded in the text."""
    image = f"\n\n<start_of_image>{'<image_soft_token>' * TOKENS_PER_IMAGE}<end_of_image>\n\n"
    text = f"<bos><start_of_turn>user {QUESTION} {image}<end_of_turn> <start_of_turn>model "
    return list(_tokenizer().encode(text, add_special_tokens=False).ids)


def _hf_answer(hf: torch.nn.Module, picture: Path) -> str:
    pixels = Gemma3ImageProcessorPil(size={"height": SIZE, "width": SIZE})(
        Image.open(picture), return_tensors="pt"
    )["pixel_values"]
    tokens = _prompt_ids()
    start = len(tokens)
    with torch.no_grad():
        for _ in range(MAX_TOKENS):
            # token_type_ids as Gemma3Processor gives them: the picture's tokens see each other both ways
            ids = torch.tensor([tokens])
            types = (ids == IMAGE_SPECIALS["<image_soft_token>"]).long()
            logits = hf(input_ids=ids, pixel_values=pixels, token_type_ids=types).logits[0, -1]
            tokens.append(int(logits.argmax()))
            if tokens[-1] == SPECIALS["<eos>"]:
                tokens.pop()
                break
    return str(_tokenizer().decode(tokens[start:], skip_special_tokens=True))


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Path]:
    path = tmp_path_factory.mktemp("gemma3-vision-tiny")
    return _write_folder(path), path


@pytest.fixture(scope="module")
def server(folder: tuple[torch.nn.Module, Path]) -> Iterator[LiveServer]:
    args = ["--w", str(folder[1]), "--backend", "torch", "--dtype", "float32", "--mem", "16"]
    with live_server(args) as s:
        yield s


@pytest.fixture(scope="module")
def client(server: LiveServer) -> Any:  # Any: the tests pass plain dicts where the SDK types TypedDicts
    return openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0, timeout=120)


def _ask(url: str) -> list[dict[str, Any]]:
    content = [{"type": "text", "text": QUESTION}, {"type": "image_url", "image_url": {"url": url}}]
    return [{"role": "user", "content": content}]


def test_a_picture_answers_as_transformers(
    client: Any, folder: tuple[torch.nn.Module, Path], tmp_path: Path
) -> None:
    hf, _ = folder
    pictures = _pictures(tmp_path)
    expected = [_hf_answer(hf, p) for p in pictures]
    assert expected[0] != expected[1]  # the picture matters to this model
    model = client.models.list().data[0]
    assert (model.model_extra or {})["vision"] is True
    for picture, answer in zip(pictures, expected, strict=True):
        reply = client.chat.completions.create(
            model=model.id, messages=_ask(_data_url(picture)), max_tokens=MAX_TOKENS, temperature=0
        )
        assert reply.choices[0].message.content == answer
        # the image's 4 soft tokens and its start/end markers are prompt tokens
        assert reply.usage.prompt_tokens == len(_prompt_ids())
        assert _prompt_ids().count(IMAGE_SPECIALS["<image_soft_token>"]) == TOKENS_PER_IMAGE
    stream = client.chat.completions.create(
        model=model.id,
        messages=_ask(_data_url(pictures[0])),
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected[0]
    assert chunks[-1].usage.prompt_tokens == len(_prompt_ids())
    # the Responses API's input_image part: the same picture, the same answer
    response = client.responses.create(
        model=model.id,
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": QUESTION},
                    {"type": "input_image", "image_url": _data_url(pictures[1])},
                ],
            }
        ],
        max_output_tokens=MAX_TOKENS,
        temperature=0,
    )
    assert response.output_text == expected[1]
    assert response.usage.input_tokens == len(_prompt_ids())


def test_an_image_url_needs_the_flag(client: Any) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="", messages=_ask("https://example.com/cat.png"), max_tokens=MAX_TOKENS
        )
    assert info.value.status_code == 400
    assert "--allow-image-urls" in info.value.message


def test_a_text_only_model_refuses_a_picture(smollm2_gguf: Path, tmp_path: Path) -> None:
    picture = _pictures(tmp_path)[0]
    args = ["--f", str(smollm2_gguf), "--backend", "torch", "--mem", "16"]
    with live_server(args) as s:
        client: Any = openai.OpenAI(base_url=s.api_url, api_key="unused", max_retries=0, timeout=60)
        model = client.models.list().data[0]
        assert (model.model_extra or {})["vision"] is False
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model=model.id, messages=_ask(_data_url(picture)), max_tokens=4)
        assert f"model {model.id} does not take images; load a vision model" in info.value.message
        assert info.value.code == "model_not_multimodal"
