"""Request fields that steer sampling beyond temperature: `response_format` (a grammar the output must
follow), forced tool calls, and `logit_bias`. Grammars compile off the event loop (~1 s the first time,
while the tokenizer's grammar view is built)."""

from __future__ import annotations

import asyncio
from typing import Any

from localchat.engine.constraint import Constraint
from localchat.errors import InvalidRequestError
from localchat.serving.context import ServerContext
from localchat.structured.grammar import json_object_constraint, json_schema_constraint
from localchat.structured.harmony_grammar import harmony_call_constraint
from localchat.structured.tool_grammar import tool_call_constraint
from localchat.structured.vocabulary import grammar_tokenizer

_RESPONSE_FORMATS = ("text", "json_object", "json_schema")
# Used for forced tool calls until a tool-call parser names the model's own wrapper.
HERMES_WRAPPER = ("<tool_call>\n", "\n</tool_call>", "arguments")


async def response_constraint(
    ctx: ServerContext, fmt: dict[str, Any] | None, param: str = "response_format"
) -> Constraint | None:
    """The grammar for `response_format` (None for text); 400 naming what cannot be enforced."""
    if fmt is None or fmt.get("type") == "text":
        return None
    kind = fmt.get("type")
    if kind not in _RESPONSE_FORMATS:
        raise InvalidRequestError(
            f"'{param}.type' must be one of {', '.join(_RESPONSE_FORMATS)}.", param=param
        )
    if kind == "json_object":
        return await asyncio.to_thread(_json_object, ctx)
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict):
        raise InvalidRequestError(f"'{param}.json_schema' must be an object.", param=param)
    schema = spec.get("schema", {"type": "object"})
    if not isinstance(schema, (dict, bool)):
        raise InvalidRequestError(f"'{param}.json_schema.schema' must be a JSON Schema object.", param=param)
    return await asyncio.to_thread(_json_schema, ctx, schema, param)


async def tool_choice_constraint(
    ctx: ServerContext,
    tools: list[dict[str, Any]],
    tool_choice: str | dict[str, Any],
    wrapper: tuple[str, str, str] = HERMES_WRAPPER,
    parallel: bool = False,
) -> Constraint:
    prefix, suffix, arguments_key = wrapper
    return await asyncio.to_thread(
        lambda: tool_call_constraint(
            _grammar_tokenizer(ctx), tools, tool_choice, prefix, suffix, arguments_key, parallel=parallel
        )
    )


async def harmony_choice_constraint(
    ctx: ServerContext, tools: list[dict[str, Any]], tool_choice: str | dict[str, Any]
) -> Constraint:
    """A forced call in gpt-oss's harmony format: its header's markers are the tokenizer's own tokens."""
    tokenizer = ctx.model.tokenizer

    def is_token(marker: str) -> bool:
        return tokenizer.token_to_id(marker) is not None

    return await asyncio.to_thread(
        lambda: harmony_call_constraint(_grammar_tokenizer(ctx), tools, tool_choice, is_token)
    )


def parse_logit_bias(ctx: ServerContext, raw: dict[str, Any] | None) -> dict[int, float] | None:
    """OpenAI sends token ids as JSON object keys (strings); biases in [-100, 100]."""
    if not raw:
        return None
    vocab = ctx.model.config.vocab_size
    out: dict[int, float] = {}
    for key, bias in raw.items():
        try:
            token_id = int(key)
        except ValueError:
            token_id = -1
        if not 0 <= token_id < vocab:
            raise InvalidRequestError(
                f"'logit_bias' key {key!r} is not a token id of this model (0 to {vocab - 1}).",
                param="logit_bias",
            )
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not -100 <= bias <= 100:
            raise InvalidRequestError(
                f"'logit_bias' values must be numbers in [-100, 100], got {bias!r} for token {key}.",
                param="logit_bias",
            )
        out[token_id] = float(bias)
    return out


def _grammar_tokenizer(ctx: ServerContext) -> Any:
    return grammar_tokenizer(ctx.model.tokenizer, ctx.model.config.vocab_size)


def _json_object(ctx: ServerContext) -> Constraint:
    return json_object_constraint(_grammar_tokenizer(ctx))


def _json_schema(ctx: ServerContext, schema: dict[str, Any] | bool, param: str) -> Constraint:
    return json_schema_constraint(_grammar_tokenizer(ctx), schema, param)
