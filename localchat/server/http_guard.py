"""What the server's uvicorn gets beyond its defaults, for the CLI's server and the desktop window's alike.

- Clocks on slow clients. uvicorn times out an idle keep-alive connection, but not one that never
  finishes its request: a socket that sends half a header (or nothing), or a body that stops midway,
  would be held forever, and a few hundred of them exhaust the server's file descriptors (slowloris).
  Here a request's head must arrive within HEAD_TIMEOUT_S of its first byte (or of the connection),
  and its body may pause at most BODY_IDLE_S between two reads. Once a request is whole, nothing
  ticks: an answer may stream for as long as the model writes.
- A bound on a request's head: h11 refuses a head that has grown past 16 KiB in its buffer (uvicorn's
  `h11_max_incomplete_event_size`); httptools has no bound of its own (2 MB of headers within the head
  clock were taken in), so its protocol here answers 431 to a head over the same size, however it comes.
- An access log that never records a key: a client that sends `?api_key=...` is refused, yet the
  query string would still land in the log file in clear.

Both of uvicorn's HTTP/1.1 protocols get the clocks: httptools' (a C parser; `http_protocol()` picks it
when it is importable) and h11's (pure Python, the fallback). httptools sends a streamed token's chunk
with one join and one write where h11 runs its event and state machinery: the loop thread's CPU per
streamed token fell 263 -> 241 µs on Qwen2.5-Coder-1.5B and 106 -> 82 µs on the fake backend
(benchmarks/http_thread_cpu.py, docs/performance.md), CPU the decode's other core shares (#34).
"""

from __future__ import annotations

import asyncio
import logging
import re

import h11
from h11._connection import DEFAULT_MAX_INCOMPLETE_EVENT_SIZE
from uvicorn.protocols.http.h11_impl import H11Protocol

try:  # an optional speed-up: without its wheel the server runs on h11
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # pragma: no cover - httptools is a dependency where it has a wheel
    HttpToolsProtocol = None  # type: ignore[assignment, misc]

HEAD_TIMEOUT_S = 10.0
BODY_IDLE_S = 30.0

# Query parameters whose values are secrets (api_key, apikey, key, token, access_token, password...).
_SECRET_PARAM = re.compile(
    r"(?i)((?:^|[?&;])[^=&;]*(?:key|token|secret|password|passwd|auth)[^=&;]*=)[^&;#]*"
)


def redact_query(target: str) -> str:
    """`/v1/models?api_key=sk-1&x=2` -> `/v1/models?api_key=***&x=2`."""
    path, sep, query = target.partition("?")
    return path + sep + _SECRET_PARAM.sub(r"\1***", query) if sep else target


class RedactSecrets(logging.Filter):
    """On the `uvicorn.access` logger: its third argument is the path with the query string."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str) and "?" in args[2]:
            record.args = (*args[:2], redact_query(args[2]), *args[3:])
        return True


def install_access_log_filter() -> None:
    """Once per process (uvicorn configures its loggers when its Config is built: call it after)."""
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, RedactSecrets) for f in access.filters):
        access.addFilter(RedactSecrets())


class _Clocks:
    """The clock itself, shared by both protocols: one timer a connection, on the part of the request
    that is still coming ("head" or "body"), none once the request is whole."""

    head_timeout_s = HEAD_TIMEOUT_S
    body_idle_s = BODY_IDLE_S
    _guard: asyncio.TimerHandle | None
    _guarding: str  # "head" | "body" | ""
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    logger: logging.Logger
    client: tuple[str, int] | None

    def _start_clocks(self) -> None:
        self._guard = None
        self._guarding = ""

    def _set_guard(self, what: str, seconds: float) -> None:
        if self._guard is not None:
            self._guard.cancel()
        self._guarding = what
        self._guard = self.loop.call_later(seconds, self._expired) if what else None

    def _read_paused(self) -> bool:
        raise NotImplementedError

    def _expired(self) -> None:
        if self._guarding == "body" and self._read_paused():
            self._set_guard("body", self.body_idle_s)  # the app is slow to read, not the client to send
            return
        self._guard, self._guarding = None, ""
        if not self.transport.is_closing():
            self.logger.info("closing a connection whose request stalled (%s)", self.client)
            self.transport.close()


class GuardedH11Protocol(_Clocks, H11Protocol):
    """uvicorn's h11 protocol, plus the two clocks above. Pass it as `uvicorn.Config(http=...)`."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._start_clocks()
        super().connection_made(transport)
        self._set_guard("head", self.head_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._set_guard("", 0)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow()

    def _read_paused(self) -> bool:
        return self.flow.read_paused

    def _follow(self) -> None:
        """Arm the clock that fits where the client is in its request."""
        if self.transport.is_closing():
            self._set_guard("", 0)
        elif self.conn.their_state is h11.IDLE and self.conn.trailing_data[0]:
            # Some bytes of a head: its clock starts once and is not reset by more dribbles.
            if self._guarding != "head":
                self._set_guard("head", self.head_timeout_s)
        elif self.conn.their_state is h11.SEND_BODY:
            self._set_guard("body", self.body_idle_s)  # reset by every chunk
        elif self._guarding != "head" or self.conn.their_state is not h11.IDLE:
            self._set_guard("", 0)  # whole request in, or idle keep-alive (uvicorn's own timeout)


_HEAD_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: 32\r\nconnection: close\r\n\r\nRequest header fields too large."
)

if HttpToolsProtocol is not None:

    class GuardedHttpToolsProtocol(_Clocks, HttpToolsProtocol):
        """uvicorn's httptools protocol, plus the two clocks. The parser's callbacks say where the client
        is: a message begins at its first byte, its head ends at `on_headers_complete`, every piece of
        body is an `on_body`, and `on_message_complete` means the request is whole."""

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            self._start_clocks()
            self._head_bytes = 0  # read since the current head began (whole reads: an upper bound)
            limit = self.config.h11_max_incomplete_event_size
            self._max_head_bytes = DEFAULT_MAX_INCOMPLETE_EVENT_SIZE if limit is None else limit
            self._refused = False
            super().connection_made(transport)
            self._set_guard("head", self.head_timeout_s)  # a socket that sends nothing at all

        def data_received(self, data: bytes) -> None:
            self._head_bytes += len(data)
            super().data_received(data)
            # After parsing, so a read that completes its head is judged by on_headers_complete; a
            # head still coming holds at most the limit plus one read.
            if self._guarding == "head" and self._head_bytes > self._max_head_bytes:
                self._refuse_head()

        def connection_lost(self, exc: Exception | None) -> None:
            self._set_guard("", 0)
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            if self._refused:
                return
            super().on_message_begin()
            if self._guarding != "head":  # started once a head: not reset by more dribbles
                self._set_guard("head", self.head_timeout_s)

        def on_headers_complete(self) -> None:
            if self._refused:
                return
            self._head_bytes = 0
            size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
            if size > self._max_head_bytes:  # one read brought all of it: no ASGI task for it
                self._refuse_head()
                return
            super().on_headers_complete()
            self._set_guard("body", self.body_idle_s)  # until on_message_complete, even with no body

        def on_body(self, body: bytes) -> None:
            if self._refused:
                return
            super().on_body(body)
            self._set_guard("body", self.body_idle_s)  # reset by every chunk

        def on_message_complete(self) -> None:
            if self._refused:
                return
            self._head_bytes = 0
            super().on_message_complete()
            self._set_guard("", 0)  # whole request in; an idle keep-alive is uvicorn's own timeout

        def _refuse_head(self) -> None:
            """431 and close; the parser's callbacks for what was already read do nothing after it."""
            self._refused = True
            self._set_guard("", 0)
            if not self.transport.is_closing():
                self.logger.info("closing a connection whose request head is too large (%s)", self.client)
                self.transport.write(_HEAD_TOO_LARGE)
                self.transport.close()

        def handle_websocket_upgrade(self) -> None:
            self._set_guard("", 0)  # the connection is the websocket protocol's from here on
            super().handle_websocket_upgrade()

        def _read_paused(self) -> bool:
            return self.flow.read_paused

else:  # pragma: no cover
    GuardedHttpToolsProtocol = None  # type: ignore[assignment, misc]


def http_protocol() -> type[asyncio.Protocol]:
    """The guarded protocol to serve with: httptools' where its wheel is installed, else h11's."""
    return GuardedH11Protocol if GuardedHttpToolsProtocol is None else GuardedHttpToolsProtocol
