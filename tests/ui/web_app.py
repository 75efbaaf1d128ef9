"""The real app (`create_app`) on the fake backend, for UI tests: in-process (Litestar's test client)
or live on 127.0.0.1 (uvicorn in a thread, so tests can also look at the engine and the store)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from litestar import Litestar

from localchat.config import Settings
from localchat.server.app import create_app
from localchat.serving.assembly import build_context
from localchat.serving.context import ServerContext


def fake_app(home: Path, **settings: Any) -> tuple[Litestar, ServerContext]:
    options: dict[str, Any] = {
        "backend": "fake",
        "home": str(home),
        "kv_cache_mib": 16,
        "log": "warning",
        "allowed_hosts": ["testserver.local"],  # Litestar's TestClient's Host (the DNS-rebinding guard)
        **settings,
    }
    config = Settings(**options)
    ctx = build_context(config)
    return create_app(config, ctx), ctx


def web_state(app: Litestar) -> Any:
    """The UI's store and chat service, once the app has served a UI request."""
    return app.state.get("localchat_web")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LiveApp:
    app: Litestar
    ctx: ServerContext | None  # None: started without a model (the manager gets one at run time)
    url: str

    @property
    def web(self) -> Any:
        return web_state(self.app)


@contextlib.contextmanager
def live_app(home: Path, *, preload: bool = True, **settings: Any) -> Iterator[LiveApp]:
    """`preload=False`: the app starts its model the way `localchat serve` does, in the background
    (with no model on disk: none, and the UI offers the default)."""
    if preload:
        app, ctx = fake_app(home, **settings)
    else:
        from localchat.models.manager import ModelManager

        config = Settings(**{"home": str(home), "kv_cache_mib": 16, "log": "warning", **settings})
        app, ctx = create_app(config, ModelManager(config)), None
    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, name="ui-test-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the UI test server did not start")
        time.sleep(0.02)
    try:
        yield LiveApp(app, ctx, f"http://127.0.0.1:{port}")
    finally:
        server.should_exit = True
        thread.join(timeout=30)
