"""Running a server: uvicorn with graceful shutdown (SIGINT/SIGTERM: stop taking requests, let in-flight
ones end, exit 0). The server listens before any model is ready; `serving.assembly` builds the models."""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import uvicorn

from localchat.errors import LocalchatError
from localchat.loopback import is_loopback_host
from localchat.server import preflight
from localchat.server.http_guard import http_protocol, install_access_log_filter

if TYPE_CHECKING:
    from localchat.config import Settings
    from localchat.embeddings.model import EmbeddingModel
    from localchat.models.manager import ModelManager
    from localchat.serving.context import ServerContext

log = logging.getLogger("localchat")


def security_warning(settings: Settings) -> str | None:
    if is_loopback_host(settings.host) or settings.api_key:
        return None
    bar = "!" * 78
    return (
        f"{bar}\n  WARNING: localchat is listening on {settings.host}, reachable from other machines,\n"
        "  and NO API KEY is set: anyone who can reach this port can use the model.\n"
        f"  Set --api-key (or LOCALCHAT_API_KEY), or bind 127.0.0.1.\n{bar}"
    )


class _Server(uvicorn.Server):
    """uvicorn, except that a handled SIGINT/SIGTERM ends in exit code 0 instead of being re-raised."""

    def __init__(self, config: uvicorn.Config, models: ModelManager) -> None:
        super().__init__(config)
        self.models = models
        self.exit_code = 0

    def fail(self, exc: LocalchatError) -> None:
        """The start-up model could not be loaded: say why and stop (from the loading thread)."""
        print(f"localchat: error: {exc.message}", file=sys.stderr, flush=True)
        self.exit_code = 1
        self.should_exit = True

    def handle_exit(self, sig: int, frame: Any) -> None:
        self.models.draining = True  # new requests on open connections get 503 while in-flight ones finish
        for ctx in self.models.loaded:
            ctx.draining = True
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        with super().capture_signals():
            yield
            # NOTE: uvicorn re-raises captured signals after shutdown (exit 130/143); the shutdown was
            # graceful, so forget them.
            self._captured_signals.clear()


def serve(
    settings: Settings,
    models: ModelManager | ServerContext,
    *,
    open_browser: bool = False,
    exit_on_startup_error: bool = True,
    encoders: list[EmbeddingModel] | None = None,
) -> int:
    """Run the server until SIGINT/SIGTERM (exit code 0), or until the start-up model fails to load
    (exit code 1, the reason on stderr) unless `exit_on_startup_error` is off (then /health says it).
    `models`: the manager, or one already built context (it becomes the manager's only model)."""
    from localchat.models.manager import ModelManager
    from localchat.server.app import create_app

    if not isinstance(models, ModelManager):
        models = ModelManager.preloaded(settings, models)

    if (warning := security_warning(settings)) is not None:
        print(warning, file=sys.stderr, flush=True)
        log.warning("listening on %s without an API key", settings.host)
    app = create_app(settings, models, encoders)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log,
        timeout_graceful_shutdown=int(settings.shutdown_timeout),
        lifespan="on",
        http=http_protocol(),  # httptools (else h11), with header and idle-body timeouts
    )
    install_access_log_filter()  # after the Config: building it configured uvicorn's loggers
    server = _Server(config, models)
    if exit_on_startup_error:
        models.on_startup_error = server.fail
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    url = f"http://{'127.0.0.1' if settings.host in ('0.0.0.0', '::') else host}:{settings.port}/"
    threading.Thread(target=_announce, args=(server, url, open_browser, settings.ui), daemon=True).start()
    server.run()
    return server.exit_code


def _announce(server: uvicorn.Server, url: str, open_browser: bool, ui: bool = True) -> None:
    while not server.started and not server.should_exit:
        time.sleep(0.05)
    if not server.started:
        return
    if ui:
        print(f"localchat is serving at {url} (OpenAI API at {url}v1)", file=sys.stderr, flush=True)
    else:  # no page to open at the root: name only what answers
        print(
            f"localchat is serving the OpenAI API at {url}v1 (no web UI: --no-ui)",
            file=sys.stderr,
            flush=True,
        )
    if open_browser:
        preflight.open_browser(url)
