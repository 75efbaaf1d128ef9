"""Export a conversation as Markdown or JSON, and import one from JSON (ours, or a bare `messages` list)."""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from localchat.attachments.kinds import image_kind
from localchat.chats.records import (
    DONE,
    Attachment,
    Conversation,
    Message,
    NewAttachment,
    NewMessage,
    title_from,
)
from localchat.chats.store import Store
from localchat.errors import InvalidRequestError

FORMAT = "localchat.conversation"
VERSION = 1
MAX_IMPORT_MESSAGES = 10_000
_ROLES = ("system", "user", "assistant")
_SETTINGS = ("system_prompt", "temperature", "top_p", "max_tokens")
_THINK = re.compile(r"<think>(.*?)(?:</think>|$)", re.S)


MAX_IMPORT_ATTACHMENTS = 1_000


def to_json(
    conv: Conversation, messages: list[Message], read_image: Callable[[Attachment], bytes] | None = None
) -> dict[str, Any]:
    """The conversation as JSON; with `read_image`, its pictures go in too (base64), so an import on
    another machine restores them."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "title": conv.title,
        "model": conv.model,
        "created_at": _iso(conv.created_at),
        "settings": {key: getattr(conv, key) for key in _SETTINGS},
        "messages": [
            {
                "role": m.role,
                "content": m.content,
                "status": m.status,
                "created_at": _iso(m.created_at),
                **({"error": m.error} if m.error else {}),
                **(
                    {
                        "usage": {"prompt_tokens": m.prompt_tokens, "completion_tokens": m.completion_tokens},
                        "tokens_per_s": m.tokens_per_s,
                    }
                    if m.role == "assistant"
                    else {}
                ),
                **(
                    {"attachments": [_attachment_json(a, read_image) for a in m.attachments]}
                    if m.attachments
                    else {}
                ),
            }
            for m in messages
        ],
    }


def to_markdown(conv: Conversation, messages: list[Message]) -> str:
    lines = [f"# {conv.title}", "", f"*{conv.model or 'unknown model'} · {_iso(conv.created_at)}*", ""]
    if conv.system_prompt.strip():
        lines += ["## System", "", conv.system_prompt.strip(), ""]
    for m in messages:
        lines += [f"## {m.role.capitalize()}", ""]
        content = m.content
        if m.role == "assistant" and (think := _THINK.search(content)):
            quoted = "\n".join("> " + ln for ln in think.group(1).strip().splitlines())
            lines += ["> **Thinking**", ">", quoted, ""]
            content = _THINK.sub("", content, count=1)
        if m.attachments:
            lines += ["*Attached: " + ", ".join(a.name for a in m.attachments) + "*", ""]
        lines += [content.strip(), ""]
        if m.error:
            lines += [f"*Error: {m.error}*", ""]
    return "\n".join(lines).rstrip() + "\n"


def import_json(store: Store, raw: bytes | str) -> Conversation:
    """Create a conversation from exported JSON. Raises InvalidRequestError, saying what is wrong."""
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidRequestError(f"The file is not valid JSON ({exc}).") from exc
    if isinstance(data, list):
        data = {"messages": data}
    if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
        raise InvalidRequestError(
            "The JSON must be an exported conversation: an object with a `messages` list."
        )
    raw_messages = data["messages"]
    if len(raw_messages) > MAX_IMPORT_MESSAGES:
        raise InvalidRequestError(f"The conversation has more than {MAX_IMPORT_MESSAGES:,} messages.")
    messages: list[NewMessage] = []
    pictures: dict[int, tuple[bytes, str]] = {}  # written only once the whole file has been checked
    system_prompt = ""
    attached = sum(
        len(i["attachments"])
        for i in raw_messages
        if isinstance(i, dict) and isinstance(i.get("attachments"), list)
    )
    if attached > MAX_IMPORT_ATTACHMENTS:
        raise InvalidRequestError(
            f"The conversation has more than {MAX_IMPORT_ATTACHMENTS:,} attached files."
        )
    for i, item in enumerate(raw_messages):
        if (
            not isinstance(item, dict)
            or item.get("role") not in _ROLES
            or not isinstance(item.get("content"), str)
        ):
            raise InvalidRequestError(
                f"Message {i + 1} needs a `role` (system, user or assistant) and a string `content`."
            )
        if item["role"] == "system" and not messages and not system_prompt:
            system_prompt = item["content"]  # a leading system message is the conversation's system prompt
            continue
        usage: dict[str, Any] = item["usage"] if isinstance(item.get("usage"), dict) else {}
        extra = {
            "prompt_tokens": _int(usage.get("prompt_tokens")),
            "completion_tokens": _int(usage.get("completion_tokens")),
            "error": item["error"] if isinstance(item.get("error"), str) else None,
        }
        status = str(item["status"]) if item.get("status") in ("done", "stopped", "error") else DONE
        raw_attachments: list[Any] = item["attachments"] if isinstance(item.get("attachments"), list) else []
        attachments = [a for raw in raw_attachments if (a := _attachment_from(raw, i, pictures)) is not None]
        messages.append(NewMessage(item["role"], item["content"], status, extra, attachments))
    settings: dict[str, Any] = data["settings"] if isinstance(data.get("settings"), dict) else {}
    clean = _settings(settings)
    clean.setdefault("system_prompt", system_prompt)
    first_user = next((m.content for m in messages if m.role == "user"), "")
    title: str = (
        data["title"]
        if isinstance(data.get("title"), str) and data["title"].strip()
        else title_from(first_user)
    )
    model = data.get("model") if isinstance(data.get("model"), str) else ""
    for m in messages:
        for attachment in m.attachments:
            if (picture := pictures.get(id(attachment))) is not None:
                attachment.sha256 = store.files.save(*picture)
    return store.create_conversation(title.strip()[:200], messages, model=model, **clean)


def _attachment_json(a: Attachment, read_image: Callable[[Attachment], bytes] | None) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": a.kind, "name": a.name, "media_type": a.media_type, "size": a.size}
    if a.kind == "document":
        out.update(text=a.text or "", truncated=a.truncated)
    elif read_image is not None:
        try:
            out["data"] = base64.b64encode(read_image(a)).decode("ascii")
        except OSError:
            out["missing"] = True  # the file is gone from the data dir: the export says so, and goes on
    return out


def _attachment_from(raw: object, i: int, pictures: dict[int, tuple[bytes, str]]) -> NewAttachment | None:
    """An exported attachment, checked; a picture's bytes wait in `pictures` (by the attachment's id())
    until the whole import is valid. None for a picture the export says was missing."""
    where = f"Message {i + 1}'s attachment"
    if (
        not isinstance(raw, dict)
        or not isinstance(raw.get("name"), str)
        or raw.get("kind") not in ("image", "document")
    ):
        raise InvalidRequestError(f"{where} needs a `kind` (image or document) and a `name`.")
    name = raw["name"][:255]
    if raw["kind"] == "document":
        if not isinstance(raw.get("text"), str):
            raise InvalidRequestError(f"{where} {name} needs its `text`.")
        media_type = (
            raw["media_type"] if raw.get("media_type") in ("application/pdf", "text/plain") else "text/plain"
        )
        size = _int(raw.get("size"))
        return NewAttachment(
            "document", name, media_type, size, text=raw["text"], truncated=raw.get("truncated") is True
        )
    if raw.get("missing") is True and "data" not in raw:
        return None
    try:
        data = base64.b64decode(str(raw.get("data", "")), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidRequestError(f"{where} {name} has no valid base64 `data` ({exc}).") from exc
    kind = image_kind(data)
    if kind is None:
        raise InvalidRequestError(f"{where} {name} is not a PNG, JPEG, GIF or WebP picture.")
    attachment = NewAttachment("image", name, kind.media_type, len(data))
    pictures[id(attachment)] = (data, kind.ext)
    return attachment


def _settings(raw: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(raw.get("system_prompt"), str) and raw["system_prompt"]:
        out["system_prompt"] = raw["system_prompt"]
    for key in ("temperature", "top_p"):
        value = raw.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = float(value)
    if (
        isinstance(raw.get("max_tokens"), int)
        and not isinstance(raw["max_tokens"], bool)
        and raw["max_tokens"] > 0
    ):
        out["max_tokens"] = raw["max_tokens"]
    return out


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat(timespec="seconds")
