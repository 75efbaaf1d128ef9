"""The web UI's sidebar: the conversation list, search, rename, delete, import and export."""

from __future__ import annotations

import re
from typing import Any

from litestar import Request, Response, delete, get, post
from litestar.datastructures import UploadFile
from litestar.di import NamedDependency
from litestar.params import FromPath, FromQuery

from localchat.chats.conversation_io import import_json, to_json, to_markdown
from localchat.errors import InvalidRequestError, NotFoundError
from localchat.server.web.common import WebState, conv_id_from, require_htmx
from localchat.server.web.render import html, macro


@get("/ui/conversations", name="web:conversations", sync_to_thread=True)
def conversation_list(
    request: Request, web: NamedDependency[WebState], q: FromQuery[str] = ""
) -> Response[str]:
    items = web.store.list_conversations(q[:200])
    return html(macro("conversation_list", items, current=conv_id_from(request), query=q))


@get("/ui/c/{conv_id:str}/item", name="web:item", sync_to_thread=True)
def conversation_item(
    request: Request, web: NamedDependency[WebState], conv_id: FromPath[str]
) -> Response[str]:
    return html(
        macro("conversation_item", web.store.get_conversation(conv_id), current=conv_id_from(request))
    )


@get("/ui/c/{conv_id:str}/rename", name="web:rename-form", sync_to_thread=True)
def rename_form(web: NamedDependency[WebState], conv_id: FromPath[str]) -> Response[str]:
    return html(macro("rename_form", web.store.get_conversation(conv_id)))


@post("/ui/c/{conv_id:str}/rename", name="web:rename", guards=[require_htmx])
async def rename(request: Request, web: NamedDependency[WebState], conv_id: FromPath[str]) -> Response[str]:
    title = str((await request.form()).get("title", "")).strip()[:200]
    if not title:
        raise InvalidRequestError("A conversation needs a name.", param="title")
    conv = await web.chats.in_store_thread(web.store.rename_conversation, conv_id, title)
    current = conv_id_from(request)
    body = macro("conversation_item", conv, current=current)
    if current == conv.id:
        body += macro("chat_title", conv, oob=True)
    return html(body)


@delete("/ui/c/{conv_id:str}", name="web:delete", guards=[require_htmx], status_code=200, sync_to_thread=True)
def delete_conversation(
    request: Request, web: NamedDependency[WebState], conv_id: FromPath[str]
) -> Response[str]:
    web.store.get_conversation(conv_id)
    web.chats.stop(conv_id)
    web.store.delete_conversation(conv_id)
    headers = {"HX-Redirect": "/"} if conv_id_from(request) == conv_id else {}
    return html("", headers=headers)


@post("/ui/import", name="web:import", guards=[require_htmx])
async def import_conversation(request: Request, web: NamedDependency[WebState]) -> Response[str]:
    upload = (await request.form()).get("file")
    if not isinstance(upload, UploadFile):
        raise InvalidRequestError("Choose a JSON file exported from localchat to import.", param="file")
    conv = await web.chats.in_store_thread(import_json, web.store, await upload.read())
    return html("", headers={"HX-Redirect": f"/c/{conv.id}"})


@get("/ui/c/{conv_id:str}/export/{fmt:str}", name="web:export", sync_to_thread=True)
def export(web: NamedDependency[WebState], conv_id: FromPath[str], fmt: FromPath[str]) -> Response[Any]:
    conv = web.store.get_conversation(conv_id)
    messages = web.store.get_messages(conv_id)
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", conv.title).strip("-")[:60] or "conversation"
    content: str | dict[str, Any]
    if fmt == "md":
        content, media_type = to_markdown(conv, messages), "text/markdown; charset=utf-8"
    elif fmt == "json":
        content, media_type = to_json(conv, messages, web.store.read_image), "application/json"
    else:
        raise NotFoundError("Export as `md` or `json`.")
    disposition = f'attachment; filename="{stem}.{fmt}"'
    return Response(content, media_type=media_type, headers={"Content-Disposition": disposition})


ROUTES = [
    conversation_list,
    conversation_item,
    rename_form,
    rename,
    delete_conversation,
    import_conversation,
    export,
]
