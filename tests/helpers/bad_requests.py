"""Malformed and hostile requests, each with the OpenAI error it must get. Shared by the fake-backend
route tests and the e2e tests on the real server. The server under test has API key `API_KEY`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

API_KEY = "sk-local-test"
MSG = [{"role": "user", "content": "hi"}]


@dataclass(frozen=True)
class Bad:
    id: str
    body: Any = None
    status: int = 400
    path: str = "/v1/chat/completions"
    method: str = "POST"
    raw: bytes | None = None
    headers: dict[str, str] | None = None  # None: send the right key
    param: str | None = None
    code: str | None = None


def chat(**fields: Any) -> dict[str, Any]:
    return (
        {"model": None, "messages": MSG, **fields} if "messages" not in fields else {"model": None, **fields}
    )


BAD_REQUESTS = [
    Bad("malformed-json", raw=b'{"messages": [', code="invalid_json"),
    Bad("json-array-body", raw=b"[]"),
    Bad("empty-body", raw=b""),
    Bad("missing-messages", {"model": None}, param="messages"),
    Bad("empty-messages", chat(messages=[]), param="messages"),
    Bad("messages-not-a-list", chat(messages="hi"), param="messages"),
    Bad("message-not-an-object", chat(messages=["hi"])),
    Bad("unknown-role", chat(messages=[{"role": "wizard", "content": "hi"}]), param="messages[0].role"),
    Bad("content-wrong-type", chat(messages=[{"role": "user", "content": 42}])),
    Bad(
        "content-image-part",
        chat(
            messages=[
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}],
                }
            ]
        ),
    ),
    Bad("user-without-content", chat(messages=[{"role": "user"}]), param="messages[0].content"),
    Bad("max-tokens-wrong-type", chat(max_tokens="ten"), param="max_tokens"),
    Bad("max-tokens-negative", chat(max_tokens=-5), param="max_tokens"),
    Bad("max-tokens-zero", chat(max_tokens=0), param="max_tokens"),
    Bad("max-tokens-huge", chat(max_tokens=10**9), param="max_tokens"),
    Bad("max-completion-tokens-negative", chat(max_completion_tokens=-1), param="max_completion_tokens"),
    Bad("temperature-negative", chat(temperature=-1), param="temperature"),
    Bad("temperature-string", chat(temperature="hot"), param="temperature"),
    Bad("temperature-above-2", chat(temperature=2.5), param="temperature"),
    Bad("top-p-zero", chat(top_p=0), param="top_p"),
    Bad("top-p-above-one", chat(top_p=1.5), param="top_p"),
    Bad("top-k-negative", chat(top_k=-2), param="top_k"),
    Bad("n-zero", chat(n=0), param="n"),
    Bad("n-huge", chat(n=1000), param="n"),
    Bad("frequency-penalty-out-of-range", chat(frequency_penalty=3), param="frequency_penalty"),
    Bad("presence-penalty-out-of-range", chat(presence_penalty=-3), param="presence_penalty"),
    Bad("stop-wrong-type", chat(stop=42), param="stop"),
    Bad("stop-unknown-object", chat(stop={"Foo": "x"}), param="stop"),
    Bad("stop-too-many", chat(stop=[f"s{i}" for i in range(40)]), param="stop"),
    Bad("logprobs-wrong-type", chat(logprobs="yes"), param="logprobs"),
    Bad("top-logprobs-too-many", chat(logprobs=True, top_logprobs=50), param="top_logprobs"),
    Bad("top-logprobs-without-logprobs", chat(top_logprobs=2), param="top_logprobs"),
    Bad("seed-wrong-type", chat(seed="abc"), param="seed"),
    Bad("stream-wrong-type", chat(stream="yes"), param="stream"),
    Bad(
        "tool-bad-name",
        chat(tools=[{"type": "function", "function": {"name": "bad name!"}}]),
        param="tools[0].function.name",
    ),
    Bad(
        "tool-params-not-object",
        chat(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]),
        param="tools[0].function.parameters",
    ),
    Bad("tool-missing-function", chat(tools=[{"type": "function"}])),
    Bad(
        "tool-choice-unknown",
        chat(tools=[{"type": "function", "function": {"name": "f"}}], tool_choice="sometimes"),
        param="tool_choice",
    ),
    Bad("response-format-unknown", chat(response_format={"type": "xml"}), param="response_format"),
    Bad(
        "unknown-model",
        {"model": "gpt-4o", "messages": MSG},
        status=404,
        param="model",
        code="model_not_found",
    ),
    Bad(
        "prompt-over-context",
        chat(messages=[{"role": "user", "content": "word " * 20000}]),
        code="context_length_exceeded",
    ),
    Bad(
        "body-10-mb",
        raw=b'{"messages": [{"role": "user", "content": "' + b"x" * 10_000_000 + b'"}]}',
        status=413,
    ),
    Bad("missing-api-key", chat(), status=401, headers={}),
    Bad("wrong-api-key", chat(), status=401, headers={"Authorization": "Bearer sk-wrong"}),
    Bad("wrong-x-api-key", chat(), status=401, headers={"X-Api-Key": "nope"}),
    Bad("completions-missing-prompt", {"max_tokens": 3}, path="/v1/completions", param="prompt"),
    Bad("completions-empty-prompt-list", {"prompt": []}, path="/v1/completions", param="prompt"),
    Bad("completions-mixed-token-list", {"prompt": [[1, "a"]]}, path="/v1/completions", param="prompt"),
    Bad(
        "completions-logprobs-too-many",
        {"prompt": "x", "logprobs": 99},
        path="/v1/completions",
        param="logprobs",
    ),
    Bad("completions-suffix", {"prompt": "x", "suffix": "y"}, path="/v1/completions", param="suffix"),
    Bad("unknown-route", {"input": "x"}, status=404, path="/v1/embeddingz"),
    Bad("wrong-method", None, status=405, method="GET"),
]


def send(client: httpx.Client, bad: Bad) -> httpx.Response:
    headers = {"Authorization": f"Bearer {API_KEY}"} if bad.headers is None else dict(bad.headers)
    if bad.raw is not None:
        content = bad.raw
    elif bad.body is not None:
        import json

        content = json.dumps({k: v for k, v in bad.body.items() if v is not None}).encode()
    else:
        content = None
    if content is not None:
        headers["Content-Type"] = "application/json"
    return client.request(bad.method, bad.path, content=content, headers=headers)


def check_error(bad: Bad, response: httpx.Response) -> None:
    assert response.status_code == bad.status, (bad.id, response.status_code, response.text[:300])
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"], error
    if bad.param is not None:
        assert error["param"] == bad.param, (bad.id, error)
    if bad.code is not None:
        assert error["code"] == bad.code, (bad.id, error)
    if bad.status == 401:
        assert error["type"] == "authentication_error"
