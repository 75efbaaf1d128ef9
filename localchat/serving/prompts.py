"""Prompts off the event loop. Rendering a chat template and tokenizing are CPU work in Python: a prompt
of a few MiB takes seconds, and done inline in an async handler it would stall every other request
(/health included) for that long. So both run on a worker thread, and a prompt far longer than the
model's context could ever hold is refused by its length in characters before it is tokenized."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio.to_thread

from localchat.errors import InvalidRequestError
from localchat.serving.generation import check_prompt_length

if TYPE_CHECKING:
    from localchat.serving.context import ServerContext

# No tokenizer we load averages anywhere near this many characters per token (English text is ~4,
# code ~3; even runs of spaces merge into tokens of at most a few dozen), so a longer text cannot fit.
MAX_CHARS_PER_TOKEN = 64


class PromptTooLongError(InvalidRequestError):
    """Refused by its length in characters, before tokenizing: the same 400 as too many tokens."""

    code = "context_length_exceeded"

    def __init__(self, chars: int, max_model_len: int, param: str) -> None:
        super().__init__(
            f"This model's maximum context length is {max_model_len} tokens, and the prompt has {chars} "
            "characters: far more than that many tokens can hold. Shorten the conversation or start a "
            "new chat.",
            param=param,
        )


def check_prompt_chars(ctx: ServerContext, chars: int, param: str = "messages") -> None:
    max_model_len = ctx.engine.max_model_len
    if chars > max_model_len * MAX_CHARS_PER_TOKEN:
        raise PromptTooLongError(chars, max_model_len, param)


def _chat(
    ctx: ServerContext,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    param: str,
    **kw: Any,
) -> tuple[str, list[int]]:
    text, ids = ctx.chat_tokens(
        messages, tools, check_text=lambda text: check_prompt_chars(ctx, len(text), param), **kw
    )
    check_prompt_length(ctx, len(ids), param)
    return text, ids


async def chat_prompt(
    ctx: ServerContext,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    *,
    param: str = "messages",
    **template_kwargs: Any,
) -> tuple[str, list[int]]:
    """(prompt text, token ids) of a conversation, checked against the context length."""
    return await anyio.to_thread.run_sync(lambda: _chat(ctx, messages, tools, param, **template_kwargs))


def _text(ctx: ServerContext, text: str, param: str) -> list[int]:
    check_prompt_chars(ctx, len(text), param)
    return list(ctx.model.tokenizer.encode(text))


async def encode_text(ctx: ServerContext, text: str, *, param: str = "prompt") -> list[int]:
    """A raw prompt's token ids (with the tokenizer's own special tokens, as /v1/completions wants)."""
    return await anyio.to_thread.run_sync(_text, ctx, text, param)
