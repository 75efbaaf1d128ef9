"""What the web UI's route modules share: their state (store, chat service) and request helpers."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.exceptions import PermissionDeniedException
from litestar.handlers import BaseRouteHandler

from localchat.chats.conversations import ChatService
from localchat.chats.store import Store


@dataclass(slots=True)
class WebState:
    store: Store
    chats: ChatService


def require_htmx(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    # A header a cross-site form cannot send: state changes only come from the UI's own scripts.
    if connection.headers.get("hx-request") != "true":
        raise PermissionDeniedException("This action is only available from the localchat web UI.")


def current_path(request: Request) -> str:
    return urlsplit(request.headers.get("hx-current-url", "")).path


def conv_id_from(request: Request) -> str | None:
    match = re.fullmatch(r"/c/([0-9a-f]+)", current_path(request))
    return match.group(1) if match else None
