"""GET /ui/about: the About dialog's content (version, data directory, log file, model, backend and
device), plus the desktop app's "serve the API" switch when the window is the one asking."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, get

from localchat import __version__
from localchat.logs import log_path
from localchat.paths import data_dir
from localchat.server.common import get_models
from localchat.server.web.backend_words import backend_in_words
from localchat.server.web.render import html, render

DESKTOP_STATE_KEY = "desktop_hooks"  # set on the app's state by localchat.desktop.app


@get("/ui/about", name="web:about", sync_to_thread=False)
def about(request: Request[Any, Any, Any]) -> Response[str]:
    settings = request.app.state.settings
    loaded = get_models(request).loaded
    runner = loaded[0].engine.engine.runner if loaded else None
    return html(
        render(
            "_about.html",
            version=__version__,
            data_dir=str(data_dir()),
            log_file=str(log_path()),
            model_id=", ".join(ctx.model_id for ctx in loaded) or "none loaded yet",
            backend=backend_in_words(runner, settings.backend),
            details=getattr(runner, "device_name", ""),
            desktop=request.app.state.get(DESKTOP_STATE_KEY),
            api_port=settings.port,
        )
    )


ROUTES = [about]
