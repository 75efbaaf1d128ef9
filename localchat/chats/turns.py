"""What a web-UI turn reads and writes in the conversation store: the user's message and its files, the
empty answer it starts, a regenerated or edited turn, and the history and pictures the model reads.
ChatService (conversations.py) runs these on its store thread (`attach` runs its own worker thread).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from localchat.attachments.kinds import AttachmentError
from localchat.attachments.prepare import AttachmentRules, Upload, prepare
from localchat.chats.history import Pictures
from localchat.chats.records import STREAMING, Conversation, Message, NewAttachment, NewMessage, title_from
from localchat.chats.store import Store
from localchat.errors import InvalidRequestError
from localchat.vision.content import ImageLimits
from localchat.vision.model_info import takes_images

if TYPE_CHECKING:
    from localchat.serving.context import ServerContext

MAX_MESSAGE_CHARS = 200_000


async def attach(store: Store, ctx: ServerContext, uploads: list[Upload]) -> list[NewAttachment]:
    """The uploaded files checked and kept (pictures as files, documents as text), off the loop."""
    if not uploads:
        return []
    limits = ImageLimits.from_settings(ctx.settings)

    def work() -> list[NewAttachment]:
        rules = AttachmentRules(
            ctx.model_id,
            takes_images(ctx.model.path),
            ctx.engine.max_model_len,
            limits.max_images,
            limits.max_bytes,
            lambda text: len(ctx.model.tokenizer.encode(text, add_special_tokens=False)),
        )
        return prepare(uploads, store.files, rules)

    try:
        return await asyncio.to_thread(work)
    except AttachmentError as exc:
        raise InvalidRequestError(str(exc), param="files") from exc


def add_turn(
    store: Store,
    conv_id: str | None,
    text: str,
    settings: dict[str, Any],
    attachments: list[NewAttachment] | None = None,
) -> tuple[Conversation, Message, Message]:
    if conv_id is None:
        title = title_from(text) if text.strip() else (attachments or [NewAttachment("", "", "")])[0].name
        conv = store.create_conversation(title or "New chat", **settings)
    else:
        store.get_conversation(conv_id)  # NotFoundError for a deleted conversation
        conv = store.update_settings(conv_id, **settings)
    user, answer = store.add_messages(
        conv.id,
        [NewMessage("user", text, attachments=attachments or ()), NewMessage("assistant", "", STREAMING)],
    )
    return conv, user, answer


def begin_answer(
    store: Store, conv_id: str, answer_id: int, ctx: ServerContext
) -> tuple[list[Message], Pictures]:
    store.update_message(answer_id, model=ctx.model_id)
    messages = store.get_messages(conv_id)
    return messages, stored_pictures(store, messages, ctx)


def stored_pictures(store: Store, messages: list[Message], ctx: ServerContext) -> Pictures:
    """(On the store thread.) The bytes of the conversation's newest pictures (as many as a request may
    carry: older ones are named instead) for a model that sees images; None for one that does not
    (its prompt names the pictures instead)."""
    images = [a for m in messages for a in m.attachments if a.kind == "image" and a.sha256]
    if not images:
        return {}
    if not takes_images(ctx.model.path):
        return None
    newest = images[len(images) - max(ctx.settings.max_images_per_request, 0) :]
    by_hash: dict[str, bytes] = {}
    for a in newest:
        if a.sha256 not in by_hash:
            by_hash[a.sha256 or ""] = store.read_image(a)
    return {a.id: by_hash[a.sha256 or ""] for a in newest}


def replace_answer(store: Store, conv_id: str) -> tuple[Conversation, Message]:
    conv = store.get_conversation(conv_id)
    messages = store.get_messages(conv_id)
    if not messages:
        raise InvalidRequestError("There is nothing to regenerate in an empty conversation.")
    if messages[-1].role == "assistant":  # kept as an alternative of the new answer
        return conv, store.regenerate_answer(conv_id, messages[-1].id)
    (answer,) = store.add_messages(conv_id, [NewMessage("assistant", "", STREAMING)])
    return conv, answer


def edit_turn(store: Store, conv_id: str, message_id: int, text: str) -> tuple[Conversation, Message]:
    conv = store.get_conversation(conv_id)
    message = store.get_message(message_id)
    if message.conversation_id != conv_id or message.role != "user":
        raise InvalidRequestError("Only your own messages in this conversation can be edited.")
    store.truncate_after(conv_id, message_id)
    store.update_message(message_id, content=text)
    (answer,) = store.add_messages(conv_id, [NewMessage("assistant", "", STREAMING)])
    return conv, answer


def save_turn(
    store: Store, conv_id: str, message_id: int, text: str, ctx: ServerContext
) -> tuple[Conversation, list[Message], Pictures]:
    """(On the store thread.) Save the answer so far; the conversation, its messages and pictures for
    the next turn."""
    store.update_message(message_id, content=text)
    messages = store.get_messages(conv_id)
    return store.get_conversation(conv_id), messages, stored_pictures(store, messages, ctx)


def check_text(text: str) -> str:
    """A typed message as sent: refused when empty or longer than MAX_MESSAGE_CHARS."""
    if not text.strip():
        raise InvalidRequestError("The message is empty.", param="content")
    if len(text) > MAX_MESSAGE_CHARS:
        raise InvalidRequestError(
            f"The message is longer than {MAX_MESSAGE_CHARS:,} characters.", param="content"
        )
    return text
