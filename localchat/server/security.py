"""The gate in front of every route: what keeps web pages the user visits from using a local server.

A page on any site can make the browser send "simple" requests (form or text/plain POSTs) to
127.0.0.1 without a CORS preflight, and a page on an attacker's domain that resolves to 127.0.0.1
(DNS rebinding) can even read the answers. So, before routing:
- a request whose `Origin` is neither the server's own nor allowlisted (`--cors-origin`) gets 403;
- a POST to a JSON API route must say `Content-Type: application/json` (415 otherwise), which no
  page can send cross-origin without a preflight;
- when bound to loopback, the `Host` must be a loopback name or an `--allowed-host` (421 otherwise):
  the host check Jupyter and Ollama do too.
Paths are normalized before they are compared (`//v1/chat/completions/` is the route Litestar serves
for `/v1/chat/completions`), and a path holding a NUL byte is nobody's route (404).

`Origin: null` is what a browser sends for its own form POST when the page asks for no referrer, and
also what a sandboxed iframe or a `data:` page anywhere sends. It passes only with the browser's own
`Sec-Fetch-Site: same-origin`, a header no page can set.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING, Any

from localchat.loopback import is_loopback_host
from localchat.server.errors import error_body

if TYPE_CHECKING:
    from localchat.config import Settings

LOOPBACK_HOST_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})
ANY_HOST = "*"

Scope = dict[str, Any]


def host_name(host: str) -> str:
    """`localhost:8000` -> `localhost`, `[::1]:8000` -> `[::1]`, lower-cased. Anything after the name
    but a `:port` keeps the whole value, so it matches no allowed name."""
    host = host.strip().lower()
    if host.startswith("[") and "]" in host:
        end = host.index("]") + 1
        name, rest = host[:end], host[end:]
    else:
        name, colon, port = host.partition(":")
        rest = colon + port
    return name if not rest or (rest[0] == ":" and rest[1:].isdigit()) else host


def route_path(path: str) -> str:
    """The path as the router matches it: repeated slashes, `.` segments and a trailing slash gone."""
    return posixpath.normpath("/" + path.lstrip("/"))


class HostCheck:
    """The DNS-rebinding guard: which `Host` headers a server answers. `check`: whether it looks at all
    (bound to loopback, or --allowed-host given, unless one of those is `*`)."""

    def __init__(self, check: bool, allowed_hosts: Iterable[str] = ()) -> None:
        extra = {host_name(h) for h in allowed_hosts if h.strip()}
        self.check = check and ANY_HOST not in extra
        self.allowed = LOOPBACK_HOST_NAMES | extra

    @classmethod
    def from_settings(cls, settings: Settings) -> HostCheck:
        return cls(is_loopback_host(settings.host) or bool(settings.allowed_hosts), settings.allowed_hosts)

    def allows(self, host: str) -> bool:
        if not self.check:
            return True
        name = host_name(host)
        # An address literal is nobody's DNS name, so every loopback address passes (127.0.0.2, ...).
        return name in self.allowed or is_loopback_host(name)


def media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


class SecurityGate:
    """ASGI middleware wrapping the whole app, so it covers every route, static files and 404s alike.

    `json_paths`: the paths of POST routes that take a JSON body. `check_host`: whether Host is checked
    (bound to loopback, or --allowed-host given); `allowed_hosts` then adds to the loopback names."""

    def __init__(
        self,
        app: Any,
        *,
        cors_origins: Iterable[str],
        json_paths: Collection[str],
        check_host: bool,
        allowed_hosts: Iterable[str] = (),
    ) -> None:
        self.app = app
        self.cors_origins = {o.rstrip("/").lower() for o in cors_origins}
        self.json_paths = frozenset(route_path(p) for p in json_paths)
        self.hosts = HostCheck(check_host, allowed_hosts)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        refusal = self.refusal(scope) if scope["type"] == "http" else None
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, message, code = refusal
        type_ = {403: "permission_error", 404: "not_found_error"}.get(status, "invalid_request_error")
        body = json.dumps(error_body(message, type_, None, code)).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    def refusal(self, scope: Scope) -> tuple[int, str, str] | None:
        """(status, message, code) when the request must be turned away, else None."""
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        host = headers.get("host", "")
        if not self.hosts.allows(host):
            shown = host_name(host) or "(none)"
            return (
                421,
                f"Host {shown!r} is not allowed: this server answers to localhost, 127.0.0.1 and [::1] "
                f"(a guard against DNS rebinding). To reach it by that name, start it with "
                f"--allowed-host {shown} (or LOCALCHAT_ALLOWED_HOSTS).",
                "host_not_allowed",
            )
        path = str(scope.get("path", ""))
        if "\x00" in path:  # no route, file or asset has one (the static files router would fail on it)
            return 404, f"Unknown route: {scope.get('method')} {path!r}", "not_found"
        origin = headers.get("origin")
        same_origin_null = origin == "null" and headers.get("sec-fetch-site") == "same-origin"
        if origin is not None and not same_origin_null and not self.origin_allowed(origin, scope, host):
            return (
                403,
                f"Requests from the web page origin {origin!r} are not allowed. To let that page use this "
                "server, start it with --cors-origin " + origin + " (or LOCALCHAT_CORS_ORIGINS).",
                "origin_not_allowed",
            )
        if scope.get("method") == "POST" and route_path(path) in self.json_paths:
            got = media_type(headers.get("content-type", ""))
            if got != "application/json":
                return (
                    415,
                    "Send the request body as JSON with 'Content-Type: application/json' "
                    f"(got {got or 'no Content-Type'!r}).",
                    "unsupported_media_type",
                )
        return None

    def origin_allowed(self, origin: str, scope: Scope, host: str) -> bool:
        origin = origin.strip().rstrip("/").lower()
        own = f"{scope.get('scheme', 'http')}://{host.strip().lower()}"
        return origin == own or origin in self.cors_origins or ANY_HOST in self.cors_origins


def json_post_paths(handlers: Iterable[Any]) -> set[str]:
    """The paths of the POST routes among `handlers` (the OpenAI API's, which all take JSON)."""
    return {path for h in handlers if "POST" in h.http_methods for path in h.paths}


def guard_app(app: Any, settings: Settings, json_paths: Collection[str]) -> None:
    """Put the gate in front of a Litestar app's handler stack (outside CORS, so preflights from
    foreign origins are refused too while allowlisted ones are still answered by Litestar's CORS)."""
    app.asgi_handler = SecurityGate(
        app.asgi_handler,
        cors_origins=settings.cors_origins,
        json_paths=json_paths,
        check_host=is_loopback_host(settings.host) or bool(settings.allowed_hosts),
        allowed_hosts=settings.allowed_hosts,
    )
