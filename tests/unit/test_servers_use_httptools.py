"""Both servers run on the guarded httptools protocol (localchat/server/http_guard.py), seen on the
wire: a request head over 16 KiB gets httptools' guard's 431 (h11 would answer 400), from the CLI's
`localchat serve` (a subprocess on the fake backend) and from the desktop window's background server."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from localchat.desktop.server import BackgroundServer, bind_socket
from tests.helpers.live_server import live_server

HUGE_HEAD = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-Pad: " + b"v" * 40_000 + b"\r\n\r\n"


def _reply(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        with contextlib.suppress(OSError):  # the server may close before the client has sent it all
            sock.sendall(HUGE_HEAD)
        reply = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                reply += chunk
    return reply


@pytest.mark.slow
def test_the_cli_server_refuses_a_huge_head_with_httptools_431() -> None:
    with live_server(["--backend", "fake", "--no-ui"]) as server:
        assert _reply(server.port).startswith(b"HTTP/1.1 431")


async def _ok(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
def desktop_port() -> Iterator[int]:
    server = BackgroundServer(_ok, bind_socket("127.0.0.1", 0), "warning")  # type: ignore[arg-type]
    server.start()
    try:
        yield server.port
    finally:
        assert server.stop()


def test_the_desktop_server_refuses_a_huge_head_with_httptools_431(desktop_port: int) -> None:
    assert _reply(desktop_port).startswith(b"HTTP/1.1 431")
