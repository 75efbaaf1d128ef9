"""A conversation to prompt text and token ids, the one way every caller does it: the API's chat routes,
the web UI, the terminal chat, vision prompts and the `LLM` class. The template is given the tokenizer's
BOS/EOS and asked for the assistant's turn; the text it writes is encoded without adding special
tokens, because the template already wrote any BOS it wants."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from localchat.weights.chat_template import ChatTemplate
    from localchat.weights.tokenizer import Tokenizer


def render_chat(
    template: ChatTemplate,
    tokenizer: Tokenizer,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    **template_kwargs: Any,
) -> str:
    """The prompt text of `messages`, ending where the assistant's answer starts."""
    return template.render(
        messages,
        tools=tools,
        add_generation_prompt=True,
        bos_token=tokenizer.bos_token or "",
        eos_token=tokenizer.eos_token or "",
        **template_kwargs,
    )


def chat_tokens(
    template: ChatTemplate,
    tokenizer: Tokenizer,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    *,
    expand: Callable[[str], str] | None = None,
    check_text: Callable[[str], None] | None = None,
    **template_kwargs: Any,
) -> tuple[str, list[int]]:
    """(prompt text, token ids) of `messages`. `expand` rewrites the rendered text before encoding (vision
    widens each image marker to its tokens); `check_text` may refuse the text before the costly encode."""
    text = render_chat(template, tokenizer, messages, tools, **template_kwargs)
    if expand is not None:
        text = expand(text)
    if check_text is not None:
        check_text(text)
    return text, tokenizer.encode(text, add_special_tokens=False)
