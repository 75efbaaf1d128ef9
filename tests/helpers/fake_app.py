"""The Litestar app on the fake backend, for fast route tests (no weights, no subprocess)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from litestar.testing import TestClient

from localchat.config import Settings
from localchat.server.app import create_app
from localchat.serving.assembly import build_context
from localchat.serving.context import ServerContext

# Litestar's TestClient addresses the app as http://testserver.local; the server's DNS-rebinding guard
# answers only loopback names unless told otherwise.
TEST_CLIENT_HOST = "testserver.local"


def fake_settings(**overrides: Any) -> Settings:
    base = {"backend": "fake", "kv_cache_mib": 2, "ui": False, "allowed_hosts": [TEST_CLIENT_HOST]}
    return Settings.load({**base, **overrides}, environ={})


@contextlib.contextmanager
def fake_client(**overrides: Any) -> Iterator[tuple[TestClient[Any], ServerContext]]:
    settings = fake_settings(**overrides)
    ctx = build_context(settings)
    with TestClient(create_app(settings, ctx), timeout=30) as client:
        yield client, ctx


def say(text: str, slow_ms: int = 0) -> list[dict[str, str]]:
    """Messages that make the fake model answer `text` (slowly, with slow_ms per step)."""
    slow = f"<<slow:{slow_ms}>>" if slow_ms else ""
    return [{"role": "user", "content": f"{slow}<<say:{text}>>"}]
