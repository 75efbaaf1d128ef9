"""GET /ui/about: the About dialog's content (version, data directory, log file, model, backend and
device), plus the desktop app's "serve the API" switch when the window is the one asking."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, get

from localchat import __version__
from localchat.logs import log_path
from localchat.paths import data_dir
from localchat.server.web_render import html, render

DESKTOP_STATE_KEY = "desktop_hooks"  # set on the app's state by localchat.desktop


@get("/ui/about", name="web:about", sync_to_thread=False)
def about(request: Request[Any, Any, Any]) -> Response[str]:
    ctx = request.app.state.ctx
    settings = ctx.settings
    runner = ctx.engine.engine.runner
    desktop = request.app.state.get(DESKTOP_STATE_KEY)
    return html(
        render(
            "_about.html",
            version=__version__,
            data_dir=str(data_dir()),
            log_file=str(log_path()),
            model_id=ctx.model_id,
            backend=settings.backend if settings.backend != "auto" else f"auto ({type(runner).__module__})",
            device=getattr(runner, "device_name", "unknown"),
            desktop=desktop,
            api_port=settings.port,
        )
    )


ROUTES = [about]
