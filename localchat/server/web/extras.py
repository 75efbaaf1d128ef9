"""The chat page's extras: example prompts on an empty chat, the global default system prompt and the
saved presets (sampling + system prompt) that the settings dialog applies."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from litestar import MediaType, Request, Response, delete, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath

from localchat.chats.records import Conversation, Message, Preset
from localchat.chats.store import Store
from localchat.errors import InvalidRequestError
from localchat.server.web.common import WebState, require_htmx
from localchat.server.web.forms import parse_settings
from localchat.server.web.render import environment, html, macro

# (title, prompt): shown as buttons on an empty chat; a click sends the prompt. Everyday tasks a small
# local model answers well, so a first try shows what it can do.
EXAMPLE_PROMPTS: list[tuple[str, str]] = [
    ("Write a haiku", "Write a haiku about tea."),
    ("Explain a concept", "Explain what a hash table is, in three short paragraphs."),
    ("Write some code", "Write a Python function that checks whether a string is a palindrome."),
    ("Plan something", "Give me a packing list for a weekend hiking trip."),
]

DEFAULT_SYSTEM_PROMPT_KEY = "default_system_prompt"  # app_settings: the system prompt new chats start with
MAX_PRESET_NAME = 60


def extras_macro(name: str, *args: Any) -> str:
    """One macro of `_extras.html` (the settings dialog's preset picker)."""
    return str(getattr(environment().get_template("_extras.html").module, name)(*args))


def _preset_picker(web: WebState, selected: str = "") -> Response[str]:
    return html(extras_macro("preset_picker", web.store.list_presets(), selected))


@post("/ui/presets", name="web:save-preset", guards=[require_htmx])
async def save_preset(web: NamedDependency[WebState], request: Request) -> Response[str]:
    """Save the settings dialog's system prompt and sampling fields under a name (replacing one of that name)."""
    form = await request.form()
    name = " ".join(str(form.get("preset_name", "")).split())[:MAX_PRESET_NAME]
    if not name:
        raise InvalidRequestError("Give the preset a name first.", param="preset_name")
    settings = parse_settings(form, web.chats) or {}
    preset = Preset(name, **{k: v for k, v in settings.items() if k != "model"})
    await web.chats.in_store_thread(web.store.save_preset, preset)
    return _preset_picker(web, name)


@post("/ui/presets/delete", name="web:delete-preset", guards=[require_htmx])
async def delete_preset(web: NamedDependency[WebState], request: Request) -> Response[str]:
    name = str((await request.form()).get("preset", ""))
    if not name:
        raise InvalidRequestError("Pick the preset to delete first.", param="preset")
    await web.chats.in_store_thread(web.store.delete_preset, name)
    return _preset_picker(web)


@post("/ui/default-system-prompt", name="web:default-system-prompt", guards=[require_htmx])
async def default_system_prompt(web: NamedDependency[WebState], request: Request) -> Response[str]:
    """The settings dialog's system prompt becomes the one every new chat starts with."""
    settings = parse_settings({"system_prompt": (await request.form()).get("system_prompt", "")}, web.chats)
    text = (settings or {}).get("system_prompt", "")
    await web.chats.in_store_thread(web.store.set_setting, DEFAULT_SYSTEM_PROMPT_KEY, text)
    return html("New chats now start with this system prompt." if text else "New chats start with none.")


@delete(
    "/ui/c/{conv_id:str}/m/{message_id:int}",
    name="web:delete-message",
    guards=[require_htmx],
    status_code=200,
)
async def delete_message(
    web: NamedDependency[WebState], conv_id: FromPath[str], message_id: FromPath[int]
) -> Response[str]:
    """One message out of a chat (its element is swapped for nothing). Not while an answer is written:
    the answer being streamed belongs to the turn."""
    if web.chats.is_generating(conv_id):
        raise InvalidRequestError("Wait for the answer to finish (or stop it) before deleting messages.")
    message = await web.chats.in_store_thread(web.store.get_message, message_id)
    if message.conversation_id != conv_id:
        raise InvalidRequestError("That message is not in this conversation.", param="message_id")
    await web.chats.in_store_thread(web.store.delete_message, conv_id, message_id)
    return html("")


@get("/ui/ping", name="web:ping", sync_to_thread=False, opt={"public": True})
def ping(request: Request) -> Response[str]:
    """What the page polls to notice a stopped server: always 200 while the server runs (unlike
    /health, whose 503 for "no model yet" a browser logs as an error), with the server's state."""
    status = request.app.state.models.health()[1].get("status", "ok")
    return Response(str(status), media_type=MediaType.TEXT, headers={"Cache-Control": "no-store"})


def _versions(store: Store, message: Message) -> list[dict[str, Any]]:
    """The answer and its alternatives, oldest first; `current` marks the one in the chat."""
    versions = [{**asdict(a), "current": False} for a in store.alternatives(message.id)]
    versions.append({**asdict(message), "current": True, "id": None})
    return sorted(versions, key=lambda v: v["created_at"])


def _answer_in(web: WebState, conv_id: str, message_id: int) -> Message:
    message = web.store.get_message(message_id)
    if message.conversation_id != conv_id or message.role != "assistant":
        raise InvalidRequestError("That answer is not in this conversation.", param="message_id")
    return message


@post("/ui/c/{conv_id:str}/m/{message_id:int}/version", name="web:version", guards=[require_htmx])
async def switch_version(
    request: Request, web: NamedDependency[WebState], conv_id: FromPath[str], message_id: FromPath[int]
) -> Response[str]:
    """The previous (step -1) or next (step 1) version of an answer becomes the one in the chat."""
    step = -1 if str((await request.form()).get("step", "1")) == "-1" else 1
    if web.chats.is_generating(conv_id):
        raise InvalidRequestError("Wait for the answer to finish (or stop it) before switching versions.")

    def switch() -> tuple[Message, Conversation]:
        message = _answer_in(web, conv_id, message_id)
        versions = _versions(web.store, message)
        at = next(i for i, v in enumerate(versions) if v["current"]) + step
        if 0 <= at < len(versions):
            message = web.store.use_alternative(message_id, versions[at]["id"])
        return message, web.store.get_conversation(conv_id)

    message, conv = await web.chats.in_store_thread(switch)
    return html(macro("message", message, conv))


@get("/ui/c/{conv_id:str}/m/{message_id:int}/compare", name="web:compare", sync_to_thread=True)
def compare(
    web: NamedDependency[WebState], conv_id: FromPath[str], message_id: FromPath[int]
) -> Response[str]:
    """Every version of an answer side by side (the Compare dialog)."""
    return html(extras_macro("compare", _versions(web.store, _answer_in(web, conv_id, message_id))))


ROUTES = [save_preset, delete_preset, default_system_prompt, delete_message, ping, switch_version, compare]
