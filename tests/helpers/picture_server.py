"""What the vision e2e tests share (tests/e2e/test_*vision*_server.py and the other picture servers): a
real server with a tiny vision model, the official openai client, each picture sent as a data: URL and
its answer held to transformers' greedy answer, the second time from the prefix and encoder caches."""

from __future__ import annotations

import base64
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import openai

from tests.helpers.live_server import live_server


def data_url(path: Path) -> str:
    mime = "image/png" if path.suffix == ".png" else "image/jpeg"
    return f"data:{mime};base64," + base64.b64encode(path.read_bytes()).decode()


@contextmanager
def vision_client(args: list[str]) -> Iterator[tuple[Any, str]]:
    """A live server on `args` and an openai client to it: (client, model id), the model listed with
    vision in /v1/models."""
    with live_server(args) as server:
        client: Any = openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0, timeout=120)
        model = client.models.list().data[0]
        assert (model.model_extra or {})["vision"] is True
        yield client, model.id


def assert_answers(
    client: Any,
    model: str,
    pictures: Sequence[Path],
    expected: Sequence[tuple[str, int]],
    question: str,
    max_tokens: int,
    *,
    turns: int = 2,
    text_first: bool = False,
    exact: bool = False,
) -> None:
    """Each picture with `question`, `turns` times (the later ones from the prefix and encoder caches): the
    reply is transformers' answer and usage.prompt_tokens its prompt length (the image tokens included).
    `expected`: (answer, prompt tokens) per picture. Unless `exact`, compared without spaces: the
    word-level test vocabularies have no decoder, and the server's incremental detokenizer may join the
    first words differently from tokenizer.decode. `text_first`: the question before the picture."""
    for picture, (answer, prompt_tokens) in zip(pictures, expected, strict=True):
        parts = [
            {"type": "image_url", "image_url": {"url": data_url(picture)}},
            {"type": "text", "text": question},
        ]
        content = parts[::-1] if text_first else parts
        for _ in range(turns):
            reply = client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": content}],
                max_tokens=max_tokens,
                temperature=0,
            )
            text = reply.choices[0].message.content
            if exact:
                assert text == answer, picture.name
            else:
                assert text.replace(" ", "") == answer.replace(" ", ""), picture.name
            assert reply.usage.prompt_tokens == prompt_tokens, picture.name


def serve_and_assert_answers(
    args: list[str],
    pictures: Sequence[Path],
    expected: Sequence[tuple[str, int]],
    question: str,
    max_tokens: int,
    **options: Any,
) -> None:
    """`assert_answers` on a server of its own (see vision_client)."""
    with vision_client(args) as (client, model):
        assert_answers(client, model, pictures, expected, question, max_tokens, **options)
