"""The ASGI app the desktop window talks to. It answers at once, before the model is loaded: the loading
page, its assets and a `/health` that reports progress (same JSON as the server's own /health), then
hands every request to the real app once it is built. It also owns the desktop-only routes:

    GET  /desktop/signin?token=T   one-time token -> the UI's API key cookie, then the chat UI
    POST /desktop/focus            a second launch asks this one to show its window (instance secret)
    POST /desktop/settings         the "serve the API" switch (needs the API key cookie)
    POST /desktop/report           --selftest: what the page shows (needs the API key cookie)
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import mimetypes
import threading
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qs

from localchat.desktop.instance import FOCUS_PATH, TOKEN_HEADER
from localchat.desktop.server import LOADING_PAGE
from localchat.server.auth import COOKIE_NAME
from localchat.server.security import HostCheck
from localchat.server.web.render import SECURITY_HEADERS, ui_dir

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[..., Awaitable[None]]  # Litestar's own scope types are narrower than these

_MAX_FORM_BYTES = 64 * 1024


@dataclass(slots=True)
class Progress:
    """What /health says until the real app answers it: the model's name and the last message."""

    status: str = "loading"  # loading | downloading | error (the real app's /health adds no_model)
    model: str | None = None
    message: str = "Starting localchat…"
    detail: str | None = None
    phase: str = "load"
    done_bytes: int | None = None
    total_bytes: int | None = None
    speed_bps: float | None = None
    eta_s: float | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def say(self, message: str) -> None:  # the model fetch/load progress callback (any thread)
        with self._lock:
            self.status, self.phase, self.message = "loading", "load", message
            self.done_bytes = self.total_bytes = self.speed_bps = self.eta_s = None
        log.info("%s", message)

    def fail(self, detail: str) -> None:
        with self._lock:
            self.status, self.detail = "error", detail

    def health(self) -> dict[str, Any]:
        with self._lock:
            if self.status == "error":
                return {"status": "error", "detail": self.detail}
            progress = {
                "phase": self.phase,
                "done_bytes": self.done_bytes,
                "total_bytes": self.total_bytes,
                "speed_bps": self.speed_bps,
                "eta_s": self.eta_s,
                "message": self.message,
            }
            return {"status": self.status, "model": self.model, "progress": progress}


@dataclass(slots=True)
class DesktopHooks:
    """What the gate calls into the desktop app for; each runs on the server's thread, so keep it short."""

    focus: Callable[[], None]
    set_serve_api: Callable[[bool], None]
    report: Callable[[dict[str, Any]], None] | None = None  # set only under --selftest
    serve_api: bool = False


class DesktopGate:
    def __init__(
        self,
        build: Callable[[Progress], ASGIApp],
        *,
        api_key: str | None,
        signin_token: str,
        instance_token: str,
        hooks: DesktopHooks,
        hosts: HostCheck | None = None,
    ) -> None:
        self.progress = Progress()
        self.hosts = hosts or HostCheck(True)  # the window's server binds 127.0.0.1 unless it serves the API
        self.hooks = hooks
        self._build = build
        self._api_key = api_key
        self._signin_token: str | None = signin_token
        self._instance_token = instance_token
        self._app: ASGIApp | None = None
        self._loader: asyncio.Task[None] | None = None
        self.ready = threading.Event()  # the real app is serving
        self.signed_in = threading.Event()  # the window traded its one-time token for the cookie
        self.loading_seen = threading.Event()  # the loading page polled /health before the app was ready

    # -- ASGI -----------------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        path = scope.get("path", "")
        if scope["type"] == "http" and not self.hosts.allows(_header(scope, "host")):
            # The DNS-rebinding guard first, for the gate's own routes too (the real app has its own).
            await _respond(send, 421, b"This Host is not allowed (a guard against DNS rebinding).")
        elif scope["type"] == "http" and path.startswith("/desktop/"):
            await self._desktop_route(scope, receive, send, path)
        elif self._app is not None:
            await self._app(scope, receive, send)
        elif scope["type"] != "http":
            return  # a websocket before the app exists: refuse by closing
        elif path == "/health":
            self.loading_seen.set()
            await _json(send, 503, self.progress.health())
        elif path.startswith("/static/"):
            await self._static(send, path.removeprefix("/static/"))
        elif scope.get("method") == "GET" and "text/html" in _header(scope, "accept"):
            await _respond(send, 303, b"", [(b"location", LOADING_PAGE.encode())])
        else:
            error = {"message": "localchat is still loading its model; try again in a moment.",
                     "type": "service_unavailable", "param": None, "code": "model_loading"}  # fmt: skip
            await _json(send, 503, {"error": error})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self._loader = asyncio.create_task(self._load())
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._loader is not None:
                    if self.ready.is_set():
                        self._stop.set()  # the loader task runs the real app's shutdown and ends
                    else:
                        self._loader.cancel()  # the window closed during the load: stop waiting
                    with contextlib.suppress(asyncio.CancelledError):
                        await self._loader
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _load(self) -> None:
        """Build the real app on a daemon thread (a model load cannot be interrupted, and must not keep
        the process alive once the window is gone), then run its whole lifespan in this one task
        (anyio needs the startup and the shutdown in the same task)."""
        self._stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        built: asyncio.Future[ASGIApp] = loop.create_future()

        def build() -> None:
            app, error = None, None
            try:
                app = self._build(self.progress)
            except BaseException as exc:
                error = exc
            with contextlib.suppress(RuntimeError):  # the loop is gone: the window closed mid-load
                loop.call_soon_threadsafe(_settle, built, app, error)

        threading.Thread(target=build, name="localchat-load", daemon=True).start()
        async with AsyncExitStack() as stack:
            try:
                app = await built
                lifespan = getattr(app, "lifespan", None)
                if lifespan is not None:
                    await stack.enter_async_context(lifespan())
            except Exception as exc:
                message = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
                log.exception("the model could not be loaded")
                self.progress.fail(message)
                return
            self._app = app
            self.ready.set()
            log.info("the server is ready")
            await self._stop.wait()
        # Leaving the stack ran the real app's shutdown: engine stopped, conversation store closed.

    # -- /desktop/* -----------------------------------------------------------------------------------

    async def _desktop_route(self, scope: Scope, receive: Receive, send: Send, path: str) -> None:
        method = scope.get("method", "GET")
        if path == "/desktop/signin" and method == "GET":
            await self._signin(scope, send)
        elif path == FOCUS_PATH and method == "POST":
            if not hmac.compare_digest(_header(scope, TOKEN_HEADER).encode(), self._instance_token.encode()):
                await _respond(send, 403, b"not this instance's secret")
                return
            log.info("another launch asked for the window")
            self.hooks.focus()
            await _respond(send, 204, b"")
        elif path in ("/desktop/settings", "/desktop/report") and method == "POST":
            if not self._authorized(scope):
                await _json(send, 401, {"error": {"message": "Missing or incorrect API key.",
                                                  "type": "authentication_error", "code": "invalid_api_key"}})  # fmt: skip
                return
            body = await _read_body(receive)
            if body is None:
                await _respond(send, 413, b"request body too large")
                return
            if path == "/desktop/settings":
                serve_api = parse_qs(body.decode("utf-8", "replace")).get("serve_api", [""])[-1] == "on"
                self.hooks.set_serve_api(serve_api)
                self.hooks.serve_api = serve_api
                note = "Saved. Other programs can use the API after the next launch." if serve_api else (
                    "Saved. From the next launch only this window can use the server.")  # fmt: skip
                await _respond(
                    send, 200, _escape(note).encode(), [(b"content-type", b"text/plain; charset=utf-8")]
                )
            elif self.hooks.report is not None:
                try:
                    report = json.loads(body or b"{}")
                except ValueError:
                    await _respond(send, 400, b"the report must be JSON")
                    return
                self.hooks.report(report)
                await _respond(send, 204, b"")
            else:
                await _respond(send, 404, b"")
        else:
            await _respond(send, 404, b"")

    async def _signin(self, scope: Scope, send: Send) -> None:
        token = parse_qs(scope.get("query_string", b"").decode()).get("token", [""])[-1]
        expected = self._signin_token
        # A wrong token leaves the right one usable (else any local page could spend the window's sign-in
        # with one bad request); guessing 24 random bytes is hopeless either way. The right one works once.
        if expected is None or not hmac.compare_digest(token.encode(), expected.encode()):
            body = b"This sign-in link was already used or is wrong. Restart localchat to sign in again."
            await _respond(send, 403, body, [(b"content-type", b"text/plain; charset=utf-8")])
            return
        self._signin_token = None
        headers = [(b"location", b"/")]
        if self._api_key:
            # A session cookie: the key changes at every launch, so it must not outlive the window.
            cookie = f"{COOKIE_NAME}={self._api_key}; Path=/; HttpOnly; SameSite=Strict"
            headers.append((b"set-cookie", cookie.encode()))
        self.signed_in.set()
        await _respond(send, 303, b"", headers)

    def _authorized(self, scope: Scope) -> bool:
        if not self._api_key:
            return True
        cookies = SimpleCookie()
        cookies.load(_header(scope, "cookie"))
        supplied = cookies[COOKIE_NAME].value if COOKIE_NAME in cookies else ""
        return hmac.compare_digest(supplied.encode(), self._api_key.encode())

    async def _static(self, send: Send, name: str) -> None:
        root = (ui_dir() / "static").resolve()
        target = (root / name).resolve()
        if not target.is_relative_to(root) or not target.is_file():
            await _respond(send, 404, b"")
            return
        kind = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
        if kind.startswith("text/") or kind.endswith("javascript"):
            kind += "; charset=utf-8"
        await _respond(send, 200, target.read_bytes(), [(b"content-type", kind.encode())])


def _settle(future: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)


def _header(scope: Scope, name: str) -> str:
    wanted = name.lower().encode()
    for key, value in scope.get("headers", []):
        if key.lower() == wanted:
            return bytes(value).decode("latin-1")
    return ""


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


async def _read_body(receive: Receive) -> bytes | None:
    """The whole body, or None past _MAX_FORM_BYTES (these routes take a checkbox or a small report)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > _MAX_FORM_BYTES:
            return None
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


async def _json(send: Send, status: int, payload: dict[str, Any]) -> None:
    await _respond(send, status, json.dumps(payload).encode(), [(b"content-type", b"application/json")])


async def _respond(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    security = [(k.lower().encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]
    all_headers = [*security, *(headers or []), (b"content-length", str(len(body)).encode())]
    if not any(k == b"content-type" for k, _ in all_headers):
        all_headers.append((b"content-type", b"text/plain; charset=utf-8"))
    await send({"type": "http.response.start", "status": status, "headers": all_headers})
    await send({"type": "http.response.body", "body": body})
