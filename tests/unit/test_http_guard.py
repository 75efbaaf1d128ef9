"""The clocks on slow clients (localchat/server/http_guard.py), with short times, over real sockets to
uvicorn on a thread, on both guarded protocols (httptools' and h11's): a stalled body is cut after the
idle time, a body that keeps coming is not, a silent or dribbling head is cut at the head time, and a
complete request's answer may stream for longer than either clock; a head over 16 KiB is refused."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn

from localchat.server import http_guard
from localchat.server.http_guard import GuardedH11Protocol, GuardedHttpToolsProtocol, http_protocol


class QuickH11(GuardedH11Protocol):
    head_timeout_s = 0.6
    body_idle_s = 0.8


class QuickHttpTools(GuardedHttpToolsProtocol):
    head_timeout_s = 0.6
    body_idle_s = 0.8


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    size = 0
    while True:
        message = await receive()
        size += len(message.get("body", b""))
        if not message.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    for _ in range(4):  # a slow answer: 1.2 s in all, longer than both clocks
        await send({"type": "http.response.body", "body": f"{size};".encode(), "more_body": True})
        await asyncio.sleep(0.3)
    await send({"type": "http.response.body", "body": b"end"})


@pytest.fixture(scope="module", params=[QuickHttpTools, QuickH11], ids=["httptools", "h11"])
def port(request: pytest.FixtureRequest) -> Iterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, log_level="warning", http=request.param, lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield sock.getsockname()[1]
    server.should_exit = True
    thread.join(10)


def _closed_after(sock: socket.socket, limit: float) -> float:
    started = time.monotonic()
    sock.settimeout(limit)
    assert sock.recv(1024) == b"", "the server answered instead of closing"
    return time.monotonic() - started


def test_a_stalled_body_is_cut_after_the_idle_time(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc")
        assert 0.6 < _closed_after(sock, 5) < 2


def test_a_body_that_keeps_coming_is_not_cut(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\nConnection: close\r\n\r\n")
        for byte in b"abcdef":  # 6 pauses of 0.5 s: 3 s in all, each under the idle time
            time.sleep(0.5)
            sock.sendall(bytes([byte]))
        sock.settimeout(10)
        reply = b""
        while chunk := sock.recv(4096):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b"end\r\n0\r\n\r\n") and b"6;" in reply


def test_a_head_sent_byte_by_byte_is_cut_at_the_head_time(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        started = time.monotonic()
        with pytest.raises(OSError):  # reset or broken pipe once the server has closed it
            for byte in b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"y" * 100:
                sock.sendall(bytes([byte]))
                time.sleep(0.1)
                if time.monotonic() - started > 3:
                    break
            sock.settimeout(3)
            if sock.recv(1) == b"":
                raise ConnectionResetError
        assert time.monotonic() - started < 2


def test_an_idle_keep_alive_connection_and_the_next_request(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(10)
        reply = b""
        while not reply.endswith(b"end\r\n0\r\n\r\n"):
            reply += sock.recv(4096)
        time.sleep(1)  # longer than the head clock, shorter than uvicorn's keep-alive (5 s): not cut
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        again = b""
        while chunk := sock.recv(4096):
            again += chunk
        assert again.startswith(b"HTTP/1.1 200")


def test_a_connection_that_sends_nothing_is_cut_at_the_head_time(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        assert 0.4 < _closed_after(sock, 5) < 2


def test_a_second_request_dribbled_on_a_kept_connection_is_cut(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(10)
        reply = b""
        while not reply.endswith(b"end\r\n0\r\n\r\n"):
            reply += sock.recv(4096)
        sock.sendall(b"GET / HTTP/1.1\r\nHo")  # half a head, then nothing
        assert 0.4 < _closed_after(sock, 5) < 2


def test_the_server_serves_on_httptools_when_it_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    assert http_protocol() is GuardedHttpToolsProtocol
    monkeypatch.setattr(http_guard, "GuardedHttpToolsProtocol", None)  # as without its wheel
    assert http_protocol() is GuardedH11Protocol


def _reply_to(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(10)
        with contextlib.suppress(OSError):  # the server may close before the client has sent it all
            sock.sendall(request)
        reply = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                reply += chunk
    return reply


def test_a_head_over_16_kib_is_refused_and_one_under_is_served(port: int) -> None:
    fields = b"".join(b"X-Field-%d: %s\r\n" % (i, b"v" * 1000) for i in range(12))  # ~12 KiB
    served = _reply_to(port, b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + fields + b"\r\n")
    assert served.startswith(b"HTTP/1.1 200") and served.endswith(b"end\r\n0\r\n\r\n")
    huge = b"".join(b"X-Field-%d: %s\r\n" % (i, b"v" * 1000) for i in range(2000))  # ~2 MB, many reads
    refused = _reply_to(port, b"GET / HTTP/1.1\r\nHost: x\r\n" + huge + b"\r\n")
    assert refused.startswith((b"HTTP/1.1 431", b"HTTP/1.1 400")), refused[:80]  # httptools, h11
    assert b"200 OK" not in refused
    # (h11 bounds only a head still incomplete in its buffer: one that comes whole in one read passes;
    # httptools' guard refuses any head over the bound: tests/unit/test_servers_use_httptools.py)
