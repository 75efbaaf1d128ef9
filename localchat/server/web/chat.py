"""The web UI's chatting: send, stop, regenerate, edit, per-conversation settings, and the answer stream."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from litestar import Request, Response, get, post
from litestar.datastructures import UploadFile
from litestar.di import NamedDependency
from litestar.params import FromPath
from litestar.response import ServerSentEvent, ServerSentEventMessage
from markupsafe import escape

from localchat.attachments.prepare import Upload
from localchat.chats.conversations import Approval
from localchat.errors import InvalidRequestError, NotFoundError
from localchat.server.web.common import WebState, require_htmx
from localchat.server.web.forms import parse_settings
from localchat.server.web.render import environment, html, macro

# An SSE event with empty data is never dispatched by browsers: this clears the approval slot instead.
NO_APPROVAL = '<span class="no-approval"></span>'
# Without the server, a browser would retry the stream every few seconds on its own; the UI's notice
# and its Retry button take over instead (a dead server must be visible, not a frozen answer).
STREAM_RETRY_MS = 3_600_000


@post("/ui/chats", name="web:new-chat", guards=[require_htmx])
async def new_chat(request: Request, web: NamedDependency[WebState]) -> Response[str]:
    form = await request.form()
    model = str(form.get("model", "")) or None  # the header's picker
    conv, _ = await web.chats.send(
        None, str(form.get("content", "")), parse_settings(form, web.chats), model, await uploads(form)
    )
    # A full load of the new chat's page: its URL, title, sidebar entry and the answer's stream at once.
    return html("", headers={"HX-Redirect": f"/c/{conv.id}"})


@post("/ui/c/{conv_id:str}/messages", name="web:send", guards=[require_htmx])
async def send(request: Request, web: NamedDependency[WebState], conv_id: FromPath[str]) -> Response[str]:
    form = await request.form()
    model = str(form.get("model", "")) or None  # the header's picker
    conv, messages = await web.chats.send(
        conv_id, str(form.get("content", "")), parse_settings(form, web.chats), model, await uploads(form)
    )
    return html("".join(macro("message", m, conv) for m in messages))


async def uploads(form: Any) -> list[Upload]:
    """The composer's attached files (`files` parts; an empty part is a file input left empty)."""
    found = [item for item in form.getall("files") if isinstance(item, UploadFile)] if "files" in form else []
    out = [Upload(item.filename or "file", await item.read()) for item in found]
    return [u for u in out if u.data or u.name != "file"]


@post(
    "/ui/c/{conv_id:str}/stop", name="web:stop", guards=[require_htmx], status_code=204, sync_to_thread=False
)
def stop(web: NamedDependency[WebState], conv_id: FromPath[str]) -> None:
    web.chats.stop(conv_id)


@post(
    "/ui/c/{conv_id:str}/m/{message_id:int}/tool-approval",
    name="web:tool-approval",
    guards=[require_htmx],
    status_code=204,
)
async def tool_approval(
    request: Request, web: NamedDependency[WebState], conv_id: FromPath[str], message_id: FromPath[int]
) -> None:
    """Allow / Deny / Always allow for an MCP call the answer waits on (the stream then clears it)."""
    form = await request.form()
    if not web.chats.decide(
        conv_id, message_id, str(form.get("approval", "")), str(form.get("decision", ""))
    ):
        raise InvalidRequestError("This tool call is no longer waiting for a decision.")


def approval_html(approval: Approval | None, conv_id: str, message_id: int) -> str:
    if approval is None:
        return NO_APPROVAL
    try:
        arguments = json.dumps(json.loads(approval.arguments or "{}"), indent=2, ensure_ascii=False)
    except ValueError:
        arguments = approval.arguments
    module = environment().get_template("_mcp.html").module
    return str(module.tool_approval(approval, arguments, conv_id, message_id))  # type: ignore[attr-defined]


@post("/ui/c/{conv_id:str}/regenerate", name="web:regenerate", guards=[require_htmx])
async def regenerate(web: NamedDependency[WebState], conv_id: FromPath[str]) -> Response[str]:
    message = await web.chats.regenerate(conv_id)
    return html(
        macro("message", message, await web.chats.in_store_thread(web.store.get_conversation, conv_id))
    )


@get("/ui/c/{conv_id:str}/m/{message_id:int}", name="web:message", sync_to_thread=True)
def message_view(
    web: NamedDependency[WebState], conv_id: FromPath[str], message_id: FromPath[int]
) -> Response[str]:
    return html(macro("message", web.store.get_message(message_id), web.store.get_conversation(conv_id)))


@get("/ui/c/{conv_id:str}/m/{message_id:int}/edit", name="web:edit-form", sync_to_thread=True)
def edit_form(
    web: NamedDependency[WebState], conv_id: FromPath[str], message_id: FromPath[int]
) -> Response[str]:
    return html(macro("edit_form", web.store.get_message(message_id), web.store.get_conversation(conv_id)))


@post("/ui/c/{conv_id:str}/m/{message_id:int}/edit", name="web:edit", guards=[require_htmx])
async def edit(
    request: Request, web: NamedDependency[WebState], conv_id: FromPath[str], message_id: FromPath[int]
) -> Response[str]:
    text = str((await request.form()).get("content", ""))
    messages = await web.chats.edit(conv_id, message_id, text)
    conv = await web.chats.in_store_thread(web.store.get_conversation, conv_id)
    return html("".join(macro("message", m, conv) for m in messages))


@post("/ui/c/{conv_id:str}/settings", name="web:settings", guards=[require_htmx])
async def save_settings(
    request: Request, web: NamedDependency[WebState], conv_id: FromPath[str]
) -> Response[str]:
    settings = parse_settings(await request.form(), web.chats) or {}
    await web.chats.in_store_thread(web.store.update_settings, conv_id, **settings)
    return html("Saved. The next answer uses these settings.")


@get("/ui/m/{message_id:int}/stream", name="web:stream")
async def stream(web: NamedDependency[WebState], message_id: FromPath[int]) -> ServerSentEvent:
    message = await web.chats.in_store_thread(web.store.get_message, message_id)
    conv = await web.chats.in_store_thread(web.store.get_conversation, message.conversation_id)

    async def events() -> AsyncIterator[ServerSentEventMessage]:
        async for kind, text in web.chats.events(message_id):
            if kind == "done":
                try:
                    final = macro(
                        "message", await web.chats.in_store_thread(web.store.get_message, message_id), conv
                    )
                except NotFoundError:  # deleted while it was being written
                    final = ""
                yield ServerSentEventMessage(event="done", data=final)
                return
            if kind == "approval":
                approval = web.chats.approval(message_id)
                current = approval if approval is not None and approval.id == text else None
                yield ServerSentEventMessage(event=kind, data=approval_html(current, conv.id, message_id))
                continue
            # The browser appends this as text into the message's hidden raw-markdown element.
            retry = STREAM_RETRY_MS if kind == "snapshot" else None
            yield ServerSentEventMessage(event=kind, data=str(escape(text)), retry=retry)

    return ServerSentEvent(events(), headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


ROUTES = [
    new_chat,
    send,
    stop,
    tool_approval,
    regenerate,
    message_view,
    edit_form,
    edit,
    save_settings,
    stream,
]
