"""A chat prompt with its pictures, off the event loop: the one call the API's chat routes and the web UI
make. Without image parts it is the plain chat prompt (server/prompts.py); with them, reading and
decoding the pictures, rendering, expanding the image tokens and tokenizing all run on a worker thread."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio.to_thread

from localchat.engine.request import ImageInput
from localchat.errors import InvalidRequestError
from localchat.serving.generation import check_prompt_length
from localchat.serving.prompts import check_prompt_chars
from localchat.vision.content import ImageInputError, ImageLimits
from localchat.vision.request_images import ImageRequestError, prepare_images

if TYPE_CHECKING:
    from localchat.serving.context import ServerContext

ChatPromptWithImages = tuple[str, list[int], tuple[ImageInput, ...]]


def _build(
    ctx: ServerContext,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    param: str,
    **kw: Any,
) -> ChatPromptWithImages:
    limits = ImageLimits.from_settings(ctx.settings)
    try:
        prepared = prepare_images(messages, ctx.model.path, ctx.model_id, limits)
    except ImageRequestError as exc:
        raise InvalidRequestError(str(exc), param=exc.param, code=exc.code) from exc
    text, ids = ctx.chat_tokens(
        prepared.messages,
        tools,
        expand=prepared.expand,
        check_text=lambda text: check_prompt_chars(ctx, len(text), param),
        **kw,
    )
    check_prompt_length(ctx, len(ids), param)
    try:
        images = prepared.inputs(ids)
    except ImageInputError as exc:
        raise InvalidRequestError(str(exc), param=param, code="invalid_image") from exc
    return text, ids, images


async def chat_prompt_with_images(
    ctx: ServerContext,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    *,
    param: str = "messages",
    **template_kwargs: Any,
) -> ChatPromptWithImages:
    """(prompt text, token ids, the pictures as engine inputs) of a conversation whose messages may hold
    image parts (see localchat/vision/request_images.py); InvalidRequestError (400) for a picture the
    model or the server's settings refuse."""
    return await anyio.to_thread.run_sync(lambda: _build(ctx, messages, tools, param, **template_kwargs))
