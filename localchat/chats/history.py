"""What the model reads of a stored conversation: the system prompt, the user's turns with their documents
and pictures, and the answers without their reasoning (failed or empty answers left out)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from localchat.attachments.text import context_block
from localchat.chats.records import ERROR, Conversation, Message
from localchat.mcp import ui_turns

# The bytes of the pictures the model is shown, by attachment id; None when the model does not see images.
Pictures = dict[int, bytes] | None

_THINK_BLOCK = re.compile(r"<think>.*?(</think>|$)", re.S)


def strip_thinking(text: str) -> str:
    """The answer without its `<think>` part: reasoning is not sent back to the model."""
    return _THINK_BLOCK.sub("", text).strip()


def chat_messages(
    conv: Conversation,
    history: list[Message],
    call_id: Callable[[str], str] = str,
    pictures: Pictures = None,
) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if conv.system_prompt.strip():
        messages.append({"role": "system", "content": conv.system_prompt})
    for m in history:
        if m.role == "assistant":
            content = strip_thinking(m.content)
            if m.status == ERROR or not content:
                continue  # a failed or empty answer is not part of what the model said
            messages += ui_turns.answer_messages(content, call_id)
        else:
            messages.append({"role": m.role, "content": user_content(m, pictures)})
    return messages


def user_content(m: Message, pictures: Pictures) -> str | list[dict[str, Any]]:
    """A user message as the model reads it: its documents (fenced, under their file names), its words,
    and its pictures as image parts for a model that sees them (named in words for one that does not)."""
    blocks = [context_block(a.name, a.text or "", a.truncated) for a in m.attachments if a.kind == "document"]
    images = [a for a in m.attachments if a.kind == "image"]
    if pictures is None:
        blocks += [f"[Picture {a.name}: not shown, this model does not see images]" for a in images]
        images = []
    else:
        blocks += [
            f"[Picture {a.name}: an earlier picture, not shown again]" for a in images if a.id not in pictures
        ]
        images = [a for a in images if a.id in pictures]
    text = "\n\n".join([*blocks, m.content] if m.content.strip() else blocks)
    if not images or pictures is None:
        return text
    parts: list[dict[str, Any]] = [{"type": "image_bytes", "data": pictures[a.id]} for a in images]
    # The words first, then the pictures: the order OpenAI clients send them in most often.
    return [{"type": "text", "text": text}, *parts] if text else parts
