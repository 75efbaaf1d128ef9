"""The web UI: pages under `/`, htmx partials and the answer stream under `/ui/...`, assets under `/static`.

Everything the server writes into HTML goes through autoescaped Jinja2 templates; model output is
rendered as markdown in the browser, through DOMPurify (see localchat/ui/static/app.js). This module holds the
pages, the login and the router factory; sidebar.py and chat.py hold the htmx endpoints.
"""

from __future__ import annotations

import hmac
import logging
import sqlite3
import threading
from pathlib import Path
from typing import Any
from urllib.parse import quote

from litestar import Request, Response, Router, get, post
from litestar.datastructures import Cookie
from litestar.di import NamedDependency, Provide
from litestar.exceptions import HTTPException
from litestar.params import FromPath, FromQuery
from litestar.response import Redirect
from litestar.static_files import create_static_files_router

from localchat.chats.conversations import INTERRUPTED, ChatService
from localchat.chats.records import Conversation
from localchat.chats.store import Store
from localchat.errors import AuthenticationError, DataDirError, LocalchatError
from localchat.models.manager import ModelManager
from localchat.paths import data_dir
from localchat.server.web import about as web_about
from localchat.server.web import attachments as web_attachments
from localchat.server.web import chat as web_chat
from localchat.server.web import extras as web_extras
from localchat.server.web import hub as web_hub
from localchat.server.web import models as web_models
from localchat.server.web import sidebar as web_sidebar
from localchat.server.web.common import WebState, current_path
from localchat.server.web.extras import DEFAULT_SYSTEM_PROMPT_KEY, EXAMPLE_PROMPTS
from localchat.server.web.models import model_status
from localchat.server.web.render import STATIC_HEADERS, html, macro, render, ui_dir
from localchat.vision.model_info import takes_images

log = logging.getLogger(__name__)

API_KEY_COOKIE = "localchat_api_key"
STORE_FILE = "conversations.sqlite3"
_STATE_KEY = "localchat_web"
_init_lock = threading.Lock()


# -- pages --------------------------------------------------------------------------------------------


def _page(request: Request, web: WebState, conv: Conversation | None, pick: str = "") -> Response[str]:
    models = request.app.state.models
    settings = request.app.state.settings
    current = models.lookup(None)
    model_id = (
        pick or (conv.model if conv and conv.model else None) or (current.model_id if current else None)
    )
    return html(
        render(
            "chat.html",
            conv=conv,
            messages=web.store.get_messages(conv.id) if conv else [],
            conversations=web.store.list_conversations(),
            model_id=model_id,
            model_choices=model_choices(models, model_id),
            # Drawn without a loaded model: the status partial reloads the page once one is ready.
            status=model_status(models, pick or None, reload=current is None),
            defaults=web.chats.model_defaults(),
            mcp_servers=models.mcp.servers() if models.mcp is not None else [],
            example_prompts=EXAMPLE_PROMPTS,
            presets=web.store.list_presets(),
            default_system_prompt=web.store.get_setting(DEFAULT_SYSTEM_PROMPT_KEY),
            # The composer checks attachments against these before sending (readable errors, no 413).
            max_body_bytes=settings.max_body_bytes,
            max_images=settings.max_images_per_request,
            max_image_bytes=settings.max_image_mib * 2**20,
        )
    )


def model_choices(models: ModelManager, selected: str | None) -> list[tuple[str, bool, bool]]:
    """(name, loaded, sees images) for the header's picker: the loaded models, then the other local ones."""
    paths = {ctx.model_id: ctx.model.path for ctx in reversed(models.loaded)}
    loaded = list(paths)
    local = [m for m in models.local_models() if getattr(m, "complete", True)]
    for m in local:
        paths.setdefault(str(m.name), m.path)
    names = list(dict.fromkeys([*loaded, *(str(m.name) for m in local), *([selected] if selected else [])]))
    return [(name, name in loaded, name in paths and _sees_images(paths[name])) for name in names]


def _sees_images(path: Any) -> bool:
    return isinstance(path, Path) and takes_images(path)


@get("/", name="web:index", sync_to_thread=True)
def index(request: Request, web: NamedDependency[WebState], model: FromQuery[str] = "") -> Response[str]:
    # `model`: preselected in the picker ("Use in chat" on the Models page). Only shown: a GET never
    # loads or evicts anything (any web page can make the browser send one); the load is the POST
    # to /ui/model that "Use in chat" makes first.
    return _page(request, web, None, model)


@get("/c/{conv_id:str}", name="web:chat", sync_to_thread=True)
def chat_page(request: Request, web: NamedDependency[WebState], conv_id: FromPath[str]) -> Response[str]:
    return _page(request, web, web.store.get_conversation(conv_id))


@get("/login", name="web:login", sync_to_thread=False, opt={"public": True})
def login_page(next: FromQuery[str] = "/") -> Response[str]:
    return html(render("login.html", error=None, next=_safe_next(next)))


@post("/login", name="web:login-submit", opt={"public": True})
async def login(request: Request) -> Response[Any]:
    form = await request.form()
    key, target = str(form.get("api_key", "")), _safe_next(str(form.get("next", "/")))
    expected = getattr(request.app.state.settings, "api_key", None)
    if expected and not hmac.compare_digest(key.encode(), expected.encode()):
        return html(
            render("login.html", error="That key is not the one the server was started with.", next=target),
            status=401,
        )
    cookie = Cookie(
        key=API_KEY_COOKIE, value=key, httponly=True, samesite="strict", path="/", max_age=30 * 86400
    )
    return Redirect(target, status_code=303, cookies=[cookie] if expected else [])


def _safe_next(target: str) -> str:
    return target if target.startswith("/") and not target.startswith("//") else "/"


# -- errors -------------------------------------------------------------------------------------------


def _error_response(request: Request, exc: Exception) -> Response[Any]:
    htmx = request.headers.get("hx-request") == "true"
    if isinstance(exc, AuthenticationError):  # no or a wrong key (cookie): sign in, then come back
        target = "/login?next=" + quote((current_path(request) or "/") if htmx else request.url.path)
        return html("", headers={"HX-Redirect": target}) if htmx else Redirect(target, status_code=303)
    if isinstance(exc, LocalchatError):
        status, message = exc.status, exc.message
    else:
        assert isinstance(exc, HTTPException)
        status, message = exc.status_code, str(exc.detail)
    if htmx:
        # Shown in the notice bar above the message box, whatever element made the request.
        headers = {"HX-Retarget": "#notice", "HX-Reswap": "innerHTML"}
        return html(macro("notice", message), status=status, headers=headers)
    return html(render("error.html", status=status, message=message), status=status)


ROUTES = [
    index,
    chat_page,
    login_page,
    login,
    *web_sidebar.ROUTES,
    *web_chat.ROUTES,
    *web_attachments.ROUTES,
    *web_models.ROUTES,
    *web_about.ROUTES,
    *web_extras.ROUTES,
    *web_hub.ROUTES,
]


def create_web_router(settings: Any, *, store_path: Path | None = None) -> Router:
    """The UI's routes. The store opens on the first request (the app's `state.models` must exist by then)."""
    home = Path(settings.home).expanduser() if getattr(settings, "home", None) else None
    path = store_path or (home or data_dir()) / STORE_FILE

    def web_state(request: Request) -> WebState:
        state = request.app.state
        with _init_lock:
            web = state.get(_STATE_KEY)
            if web is None:
                store = _open_store(path)
                if count := store.fail_interrupted(INTERRUPTED):
                    log.info("%d answer(s) left unfinished by a previous run were marked as failed", count)
                web = WebState(store, ChatService(store, state.models))
                state[_STATE_KEY] = web
        return web

    # Public: the assets hold no data, and the login page needs them before the key is known.
    static = create_static_files_router(
        "/static",
        directories=[ui_dir() / "static"],
        name="web:static",
        opt={"public": True},
        after_request=_static_headers,
    )
    return Router(
        "/",
        route_handlers=[*ROUTES, static],
        dependencies={"web": Provide(web_state, sync_to_thread=False)},
        exception_handlers={LocalchatError: _error_response, HTTPException: _error_response},
        include_in_schema=False,
    )


async def _static_headers(response: Response[Any]) -> Response[Any]:
    for name, value in STATIC_HEADERS.items():
        response.headers.setdefault(name, value)
    return response


def _open_store(path: Path) -> Store:
    try:
        return Store(path)
    except (OSError, sqlite3.Error) as exc:  # shown as the UI's error page, not a raw 500
        raise DataDirError(
            f"The conversations cannot be opened: {path} ({exc}). Their directory must be writable: "
            "start localchat with --home DIR (or LOCALCHAT_HOME) pointing to a writable directory."
        ) from None


def close_web_state(state: Any) -> None:
    """For the app's shutdown hook: close the conversation store if the UI opened it."""
    web = state.get(_STATE_KEY)
    if web is not None:
        web.chats.close()  # the answers' final writes first
        web.store.close()
