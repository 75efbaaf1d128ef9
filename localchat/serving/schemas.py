"""Request bodies of the OpenAI routes as msgspec structs. Unknown fields are ignored (clients send
vendor extras); every field that may be sent as `null` is optional. Decoding errors become 400s with
the offending field as `param`.
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

import msgspec

from localchat.errors import InvalidRequestError

T = TypeVar("T")
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high")
MAX_JSON_DEPTH = 64

_AT_PATH = re.compile(r" - at `\$\.?(.*)`$")
_MISSING = re.compile(r"missing required field `([^`]+)`")
# JSON Schema and OpenAI's spec count 4.0 as an integer; clients that compute counts send such floats.
_INTEGER_FIELDS = frozenset(
    {
        "max_tokens",
        "max_completion_tokens",
        "max_output_tokens",
        "n",
        "seed",
        "top_logprobs",
        "top_k",
        "best_of",
    }
)


class ContentPart(msgspec.Struct):
    type: str
    text: str | None = None
    image_url: dict[str, Any] | str | None = None  # {"url": ..., "detail": ...} (#29)


class FunctionCall(msgspec.Struct):
    name: str
    arguments: str | dict[str, Any] | None = None


class ToolCall(msgspec.Struct):
    function: FunctionCall
    id: str | None = None
    type: str | None = "function"


class ChatMessage(msgspec.Struct):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None


class FunctionDef(msgspec.Struct):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(msgspec.Struct):
    type: str
    function: FunctionDef


class StreamOptions(msgspec.Struct):
    include_usage: bool | None = None


class SamplingFields(msgspec.Struct, kw_only=True):
    """Fields shared by chat and text completions."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    # A string, a list of strings, or candle-vllm's {"Single": "..."} / {"Multiple": [...]}.
    stop: str | list[str] | dict[str, Any] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    n: int | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    include_stop_str_in_output: bool | None = None
    logit_bias: dict[str, Any] | None = None  # token id (as a string key) -> bias in [-100, 100]


class ChatCompletionRequest(SamplingFields, kw_only=True):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    # Legacy function calling (before `tools`): mapped onto tools / tool_choice.
    functions: list[FunctionDef] | None = None
    function_call: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # e.g. {"enable_thinking": false} (vLLM's extension)
    reasoning_effort: str | None = None  # OpenAI's; mapped onto the template's thinking switch

    def __post_init__(self) -> None:
        effort = self.reasoning_effort
        if effort is None:
            return
        if effort not in REASONING_EFFORTS:
            raise InvalidRequestError(
                f"'reasoning_effort' must be one of {', '.join(REASONING_EFFORTS)}, got {effort!r}.",
                param="reasoning_effort",
            )
        # Reasoning models here have one switch, not levels: "none"/"minimal" turn thinking off, any
        # level turns it on. An explicit chat_template_kwargs.enable_thinking wins; templates without
        # the switch ignore it.
        kwargs = dict(self.chat_template_kwargs or {})
        kwargs.setdefault("enable_thinking", effort not in ("none", "minimal"))
        # Templates with levels (gpt-oss: "Reasoning: low|medium|high") read reasoning_effort.
        kwargs.setdefault("reasoning_effort", effort if effort in ("low", "medium", "high") else "low")
        self.chat_template_kwargs = kwargs


class CompletionRequest(SamplingFields, kw_only=True):
    # Required, but may be null: generate from the start of a document, as OpenAI does.
    prompt: str | list[Any] | msgspec.UnsetType | None = msgspec.UNSET
    logprobs: int | None = None
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None
    response_format: dict[str, Any] | None = None


def decode_request(body: bytes, schema: type[T]) -> T:
    if not body.strip():
        raise InvalidRequestError("The request body is empty; send a JSON object.", code="invalid_json")
    try:
        raw = msgspec.json.decode(body)
        _check_depth(raw)
        if isinstance(raw, dict):
            _integral_floats(raw)
        return msgspec.convert(raw, type=schema)
    except msgspec.ValidationError as exc:
        text = str(exc)
        match = _AT_PATH.search(text)
        param = match.group(1) if match and match.group(1) else None
        reason = _AT_PATH.sub("", text)
        if missing := _MISSING.search(reason):
            param = f"{param}.{missing.group(1)}" if param else missing.group(1)
        where = f" in '{param}'" if param else ""
        raise InvalidRequestError(
            f"Invalid request{where}: {reason}.", param=param, code="invalid_type"
        ) from None
    except (msgspec.DecodeError, RecursionError) as exc:
        raise InvalidRequestError(
            f"We could not parse the JSON body of your request ({exc}). Send valid JSON with Content-Type: "
            "application/json.",
            code="invalid_json",
        ) from None


def _check_depth(value: Any) -> None:
    """Refuse JSON nested deeper than any request needs: later steps (validation, templates, copies)
    recurse through it, and a thousand levels would end in a RecursionError (a 500)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        for child in children:
            if isinstance(child, (dict, list)):
                if depth >= MAX_JSON_DEPTH:
                    raise InvalidRequestError(
                        f"The JSON body is nested more than {MAX_JSON_DEPTH} levels deep; no request needs that.",
                        code="invalid_json",
                    )
                stack.append((child, depth + 1))


def _integral_floats(raw: dict[str, Any]) -> None:
    """4.0 -> 4 in integer fields; 4.5 stays a float and fails validation with the field named."""
    for key in _INTEGER_FIELDS & raw.keys():
        value = raw[key]
        if isinstance(value, float) and value.is_integer():
            raw[key] = int(value)
