"""Streamed completions over a real socket, on both guarded HTTP protocols the server can run
(httptools' and h11's, localchat/server/http_guard.py), with the app on the fake backend: every token
in order and `[DONE]` in a well-formed chunked body, keep-alive comments while the model is slow, an
error after the stream started as one error event, a client that leaves mid-stream aborting its
request, and the connection kept for the next request."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import uvicorn

from localchat.server.app import create_app
from localchat.server.http_guard import GuardedH11Protocol, GuardedHttpToolsProtocol
from localchat.serving.assembly import build_context
from localchat.serving.context import ServerContext
from tests.helpers.fake_app import fake_settings, say
from tests.helpers.live_server import check_chat_stream, parse_sse


@dataclass
class Served:
    url: str
    ctx: ServerContext


@pytest.fixture(
    scope="module", params=[GuardedHttpToolsProtocol, GuardedH11Protocol], ids=["httptools", "h11"]
)
def served(request: pytest.FixtureRequest) -> Iterator[Served]:
    settings = fake_settings()
    ctx = build_context(settings)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(create_app(settings, ctx), log_level="warning", http=request.param, lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield Served(f"http://127.0.0.1:{sock.getsockname()[1]}", ctx)
    server.should_exit = True
    thread.join(10)


def _request(body: dict[str, Any], close: bool) -> bytes:
    payload = httpx.Request("POST", "http://x/", json={**body, "stream": True}).read()
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + (b"Connection: close\r\n" if close else b"")
        + b"Content-Length: %d\r\n\r\n" % len(payload)
        + payload
    )


def _raw_stream(url: str, body: dict[str, Any]) -> bytes:
    """The response's raw bytes as they came off the socket (chunked framing included)."""
    with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=30) as sock:
        sock.sendall(_request(body, close=True))
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    return raw


def _dechunk(raw: bytes) -> bytes:
    """The body of a chunked HTTP/1.1 response, checking each chunk's size line and the last chunk."""
    head, _, rest = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in head.lower(), head
    body = b""
    while True:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            assert rest == b"\r\n", rest
            return body
        body, rest = body + rest[:size], rest[size:]
        assert rest.startswith(b"\r\n")
        rest = rest[2:]


def _idle(ctx: ServerContext, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while ctx.engine.engine.scheduler.requests:
        assert time.monotonic() < deadline, "the request was not aborted"
        time.sleep(0.02)


def test_every_token_in_order_then_done_in_a_well_formed_chunked_body(served: Served) -> None:
    text = "Tokens, one byte each: 0123456789 and on."
    events = parse_sse(_dechunk(_raw_stream(served.url, {"messages": say(text, slow_ms=5)})))
    assert events[-1] == "[DONE]"
    assert check_chat_stream(events)["texts"] == [text]


def test_stream_options_usage_and_two_choices(served: Served) -> None:
    body = {"messages": say("xyz"), "n": 2, "stream_options": {"include_usage": True}}
    events = parse_sse(_dechunk(_raw_stream(served.url, body)))
    assert check_chat_stream(events, n=2, include_usage=True)["texts"] == ["xyz", "xyz"]
    last = events[-2]
    assert isinstance(last, dict) and last["choices"] == []
    assert last["usage"]["completion_tokens"] == 2 * (3 + 1)  # + EOS each


def test_keepalive_comments_while_the_model_is_slow(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("localchat.server.openai.chat.KEEPALIVE_S", 0.02)
    body = _dechunk(_raw_stream(served.url, {"messages": say("ab", slow_ms=150)}))
    assert b"\n: keep-alive\n\n" in body or body.startswith(b": keep-alive")
    assert check_chat_stream(parse_sse(body))["texts"] == ["ab"]


def test_an_error_after_the_stream_started_is_one_error_event(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = served.ctx.engine.engine.runner
    real = runner.execute_model
    calls = {"n": 0}

    def flaky(scheduler_output: Any, batch: Any) -> Any:
        calls["n"] += 1
        if calls["n"] > 3:
            raise RuntimeError("device fell over")
        return real(scheduler_output, batch)

    monkeypatch.setattr(runner, "execute_model", flaky)
    events = parse_sse(_dechunk(_raw_stream(served.url, {"messages": say("a long answer", slow_ms=5)})))
    assert events[-1] == "[DONE]"
    errors = [e for e in events[:-1] if isinstance(e, dict) and "error" in e]
    assert len(errors) == 1 and errors[0] is events[-2]
    assert "device fell over" in errors[0]["error"]["message"]


def test_a_client_that_leaves_mid_stream_aborts_its_request(served: Served) -> None:
    _idle(served.ctx)
    body = {"messages": say("a fairly long answer " * 20, slow_ms=20), "stream": True}
    with (
        httpx.Client(base_url=served.url, timeout=30) as client,
        client.stream("POST", "/v1/chat/completions", json=body) as r,
    ):
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("data: ")
            if seen >= 3:
                break
        assert served.ctx.engine.engine.scheduler.requests  # still generating when we leave
    _idle(served.ctx)


def test_the_connection_is_kept_for_the_next_request(served: Served) -> None:
    with socket.create_connection(("127.0.0.1", int(served.url.rsplit(":", 1)[1])), timeout=30) as sock:
        texts = []
        for word in ("one", "two", "three"):  # three streams, one after another, on one socket
            sock.sendall(_request({"messages": say(word)}, close=False))
            raw = b""
            while not raw.endswith(b"\r\n0\r\n\r\n"):
                chunk = sock.recv(65536)
                assert chunk, "the server closed a kept-alive connection"
                raw += chunk
            texts.append(check_chat_stream(parse_sse(_dechunk(raw)))["texts"][0])
        assert texts == ["one", "two", "three"]
