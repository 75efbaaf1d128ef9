"""The API key: when one is set, every route but the public ones (/health, the UI's login page)
needs it as `Authorization: Bearer KEY`, `X-Api-Key: KEY`, or the web UI's `localchat_api_key` cookie."""

from __future__ import annotations

import hmac
from typing import Any

from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler

from localchat.errors import AuthenticationError

COOKIE_NAME = "localchat_api_key"


def supplied_key(connection: ASGIConnection[Any, Any, Any, Any]) -> str | None:
    auth = connection.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return connection.headers.get("x-api-key") or connection.cookies.get(COOKIE_NAME) or None


def key_matches(supplied: str, expected: str) -> bool:
    return hmac.compare_digest(supplied.encode(), expected.encode())


def require_api_key(connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler) -> None:
    """A Litestar guard. Handlers opt out with `opt={"public": True}`; CORS preflights pass."""
    expected = connection.app.state.settings.api_key
    if not expected or handler.opt.get("public") or connection.scope.get("method") == "OPTIONS":
        return
    key = supplied_key(connection)
    if key is None:
        raise AuthenticationError(
            "Missing API key. Send it as 'Authorization: Bearer <key>' or 'X-Api-Key: <key>'.",
            code="missing_api_key",
        )
    if not key_matches(key, expected):
        raise AuthenticationError("Incorrect API key provided.")
