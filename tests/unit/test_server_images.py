"""Pictures through the API routes on the fake backend (#29): a text-only model answers 400 naming the
model and the fix (chat, streamed chat, Responses); with a vision config the refusals of the limits and
settings reach the client as OpenAI errors naming the part; text parts alone still work; /v1/models
says which models take images."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from tests.helpers.fake_app import fake_client


def _data_url(size: int = 8) -> str:
    buf = io.BytesIO()
    pixels = np.random.default_rng(0).integers(
        0, 256, (size, size, 3), dtype=np.uint8
    )  # noise: no compression
    Image.fromarray(pixels, "RGB").save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _chat(url: str, **extra: Any) -> dict[str, Any]:
    content = [{"type": "text", "text": "what is it?"}, {"type": "image_url", "image_url": {"url": url}}]
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 4, **extra}


def _error(response: Any, status: int = 400) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    return error


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    with fake_client() as (client, ctx):
        yield client, ctx


@pytest.mark.parametrize("stream", [False, True])
def test_text_only_model_refuses_a_picture(client: Any, stream: bool) -> None:
    http, _ = client
    error = _error(http.post("/v1/chat/completions", json=_chat(_data_url(), stream=stream)))
    assert error["message"].startswith("model fake-model does not take images; load a vision model")
    assert (error["param"], error["code"]) == ("messages[0].content[1]", "model_not_multimodal")


def test_responses_input_image_refused_for_a_text_only_model(client: Any) -> None:
    http, _ = client
    body = {
        "input": [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "what is it?"},
                    {"type": "input_image", "image_url": _data_url()},
                ],
            }
        ],
    }
    error = _error(http.post("/v1/responses", json=body))
    assert "does not take images" in error["message"] and error["code"] == "model_not_multimodal"
    body["input"][0]["content"][1] = {"type": "input_image", "file_id": "file-1"}  # type: ignore[index]
    assert "file_id is not supported" in _error(http.post("/v1/responses", json=body))["message"]


def test_text_parts_alone_still_answer_and_other_parts_are_refused(client: Any) -> None:
    http, _ = client
    parts = [{"type": "text", "text": "<<say:"}, {"type": "text", "text": "ok>>"}]
    r = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": parts}]})
    assert r.status_code == 200, r.text
    audio = {"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]}
    error = _error(http.post("/v1/chat/completions", json=audio))
    assert error["param"] == "messages[0].content[0]" and "image_url parts" in error["message"]


def test_models_say_whether_they_take_images(client: Any) -> None:
    http, _ = client
    cards = http.get("/v1/models").json()["data"]
    assert cards[0]["id"] == "fake-model" and cards[0]["vision"] is False
    assert http.get("/v1/models/fake-model").json()["vision"] is False


@pytest.fixture
def vision(tmp_path: Path) -> Iterator[Any]:
    """The fake model with a Gemma 3 vision config.json: the checks before rendering run as for a real one."""
    config = {"model_type": "gemma3", "mm_tokens_per_image": 2, "image_token_index": 9}
    (tmp_path / "config.json").write_text(json.dumps(config | {"vision_config": {"image_size": 28}}))
    with fake_client(max_images_per_request=2, max_image_mib=1) as (http, ctx):
        ctx.model.path = tmp_path
        yield http


@pytest.mark.parametrize(
    ("body", "message", "code"),
    [
        (_chat("https://example.com/cat.png"), "start the server with --allow-image-urls", "invalid_image"),
        (_chat("file:///etc/hostname"), "--allow-local-image-files", "invalid_image"),
        (
            _chat("data:image/png;base64,AAAA"),
            "not a readable image (PNG, JPEG, WebP or GIF)",
            "invalid_image",
        ),
        (_chat(_data_url(700)), "over this server's limit of 1 MiB (--max-image-mib)", "invalid_image"),
        (
            _chat(_data_url(), stream=True) | {"messages": [_chat(_data_url())["messages"][0]] * 3},
            "at most 2 images",
            "too_many_images",
        ),
    ],
)
def test_refusals_reach_the_client(vision: Any, body: dict[str, Any], message: str, code: str) -> None:
    error = _error(vision.post("/v1/chat/completions", json=body))
    assert message in error["message"] and error["code"] == code
    assert error["param"].startswith("messages[")
    assert vision.get("/v1/models").json()["data"][0]["vision"] is True
