"""The web UI's chatting: send, stop, regenerate, edit, per-conversation settings, and the answer stream."""

from __future__ import annotations

from collections.abc import AsyncIterator

from litestar import Request, Response, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath
from litestar.response import ServerSentEvent, ServerSentEventMessage
from markupsafe import escape

from localchat.errors import NotFoundError
from localchat.server.web_common import WebState, require_htmx
from localchat.server.web_forms import parse_settings
from localchat.server.web_render import html, macro


@post("/ui/chats", name="web:new-chat", guards=[require_htmx])
async def new_chat(request: Request, web: NamedDependency[WebState]) -> Response[str]:
    form = await request.form()
    model = str(form.get("model", "")) or None  # the header's picker
    conv, _ = web.chats.send(None, str(form.get("content", "")), parse_settings(form, web.chats), model)
    # A full load of the new chat's page: its URL, title, sidebar entry and the answer's stream at once.
    return html("", headers={"HX-Redirect": f"/c/{conv.id}"})


@post("/ui/c/{conv_id:str}/messages", name="web:send", guards=[require_htmx])
async def send(request: Request, web: NamedDependency[WebState], conv_id: FromPath[str]) -> Response[str]:
    form = await request.form()
    model = str(form.get("model", "")) or None  # the header's picker
    conv, messages = web.chats.send(
        conv_id, str(form.get("content", "")), parse_settings(form, web.chats), model
    )
    return html("".join(macro("message", m, conv) for m in messages))


@post(
    "/ui/c/{conv_id:str}/stop", name="web:stop", guards=[require_htmx], status_code=204, sync_to_thread=False
)
def stop(web: NamedDependency[WebState], conv_id: FromPath[str]) -> None:
    web.chats.stop(conv_id)


@post("/ui/c/{conv_id:str}/regenerate", name="web:regenerate", guards=[require_htmx], sync_to_thread=False)
def regenerate(web: NamedDependency[WebState], conv_id: FromPath[str]) -> Response[str]:
    message = web.chats.regenerate(conv_id)
    return html(macro("message", message, web.store.get_conversation(conv_id)))


@get("/ui/c/{conv_id:str}/m/{message_id:int}", name="web:message", sync_to_thread=False)
def message_view(
    web: NamedDependency[WebState], conv_id: FromPath[str], message_id: FromPath[int]
) -> Response[str]:
    return html(macro("message", web.store.get_message(message_id), web.store.get_conversation(conv_id)))


@get("/ui/c/{conv_id:str}/m/{message_id:int}/edit", name="web:edit-form", sync_to_thread=False)
def edit_form(
    web: NamedDependency[WebState], conv_id: FromPath[str], message_id: FromPath[int]
) -> Response[str]:
    return html(macro("edit_form", web.store.get_message(message_id), web.store.get_conversation(conv_id)))


@post("/ui/c/{conv_id:str}/m/{message_id:int}/edit", name="web:edit", guards=[require_htmx])
async def edit(
    request: Request, web: NamedDependency[WebState], conv_id: FromPath[str], message_id: FromPath[int]
) -> Response[str]:
    text = str((await request.form()).get("content", ""))
    messages = web.chats.edit(conv_id, message_id, text)
    conv = web.store.get_conversation(conv_id)
    return html("".join(macro("message", m, conv) for m in messages))


@post("/ui/c/{conv_id:str}/settings", name="web:settings", guards=[require_htmx])
async def save_settings(
    request: Request, web: NamedDependency[WebState], conv_id: FromPath[str]
) -> Response[str]:
    settings = parse_settings(await request.form(), web.chats) or {}
    web.store.update_settings(conv_id, **settings)
    return html("Saved. The next answer uses these settings.")


@get("/ui/m/{message_id:int}/stream", name="web:stream")
async def stream(web: NamedDependency[WebState], message_id: FromPath[int]) -> ServerSentEvent:
    message = web.store.get_message(message_id)
    conv = web.store.get_conversation(message.conversation_id)

    async def events() -> AsyncIterator[ServerSentEventMessage]:
        async for kind, text in web.chats.events(message_id):
            if kind == "done":
                try:
                    final = macro("message", web.store.get_message(message_id), conv)
                except NotFoundError:  # deleted while it was being written
                    final = ""
                yield ServerSentEventMessage(event="done", data=final)
                return
            # The browser appends this as text into the message's hidden raw-markdown element.
            yield ServerSentEventMessage(event=kind, data=str(escape(text)))

    return ServerSentEvent(events(), headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


ROUTES = [new_chat, send, stop, regenerate, message_view, edit_form, edit, save_settings, stream]
