"""Pictures through the real server on the MLX backend (CPU device, float32): the torch e2e's tiny random
Gemma 3 vision folder (tests/e2e/test_vision_server.py) served by `localchat serve --backend mlx` with
8-token prefill chunks, so the picture's four image tokens (prompt positions 6-9) are split across two
chunks. Each picture, sent as a data URL through the official openai client, gets transformers' greedy
answer; the model card says vision; usage counts the image tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

from tests.e2e.test_vision_server import (
    IMAGE_SPECIALS,
    MAX_TOKENS,
    _ask,
    _data_url,
    _hf_answer,
    _pictures,
    _prompt_ids,
    _write_folder,
)
from tests.helpers.live_server import live_server

pytestmark = [pytest.mark.mlx, pytest.mark.slow]


def test_a_picture_answers_as_transformers_on_mlx(tmp_path: Path) -> None:
    pytest.importorskip("mlx.core")
    folder = tmp_path / "gemma3-vision-tiny"
    hf = _write_folder(folder)
    pictures = _pictures(tmp_path)
    expected = [_hf_answer(hf, p) for p in pictures]
    assert expected[0] != expected[1]  # the picture matters to this model
    ids = _prompt_ids()
    image_at = ids.index(IMAGE_SPECIALS["<image_soft_token>"])
    assert image_at < 8 < image_at + 4  # the 8-token chunks split the image's run
    args = ["--w", str(folder), "--backend", "mlx", "--device", "cpu", "--dtype", "float32"]
    args += ["--prefill-chunk-size", "8", "--kv-cache-mib", "16"]
    with live_server(args) as server:
        client: Any = openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0, timeout=120)
        model = client.models.list().data[0]
        assert (model.model_extra or {})["vision"] is True
        for picture, answer in zip(pictures, expected, strict=True):
            reply = client.chat.completions.create(
                model=model.id, messages=_ask(_data_url(picture)), max_tokens=MAX_TOKENS, temperature=0
            )
            assert reply.choices[0].message.content == answer
            assert reply.usage.prompt_tokens == len(ids)
        stream = client.chat.completions.create(
            model=model.id,
            messages=_ask(_data_url(pictures[0])),
            max_tokens=MAX_TOKENS,
            temperature=0,
            stream=True,
        )
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == expected[0]
