"""The Responses API request (`POST /v1/responses`) and its translation into what the chat path
reads: template messages (input items, instructions, a previous response's conversation), function
tools, `tool_choice`, and `text.format` as a chat `response_format`."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import msgspec

from localchat.errors import InvalidRequestError
from localchat.serving.schemas import ChatCompletionRequest, FunctionDef, SamplingFields, Tool

_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
_TEXT_PARTS = ("input_text", "output_text", "text")


class ResponsesRequest(SamplingFields, kw_only=True):
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    max_output_tokens: int | None = None
    previous_response_id: str | None = None
    store: bool | None = None
    metadata: dict[str, Any] | None = None
    user: str | None = None
    reasoning: dict[str, Any] | None = None  # {"effort": ...}: as chat's reasoning_effort


def input_messages(req: ResponsesRequest, call_id: Callable[[str], str]) -> list[dict[str, Any]]:
    """Template messages for the request's `input` (not its instructions)."""
    if isinstance(req.input, str):
        return [{"role": "user", "content": req.input}]
    if not req.input:
        raise InvalidRequestError("'input' must not be empty.", param="input")
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(req.input):
        where = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(_message(item, where))
        elif kind == "function_call":
            call = {
                "id": call_id(_field(item, "call_id", where)),
                "type": "function",
                "function": {
                    "name": _field(item, "name", where),
                    "arguments": _arguments(item.get("arguments")),
                },
            }
            last = messages[-1] if messages else None
            if last and last["role"] == "assistant" and (last.get("tool_calls") or not last["content"]):
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else json.dumps(output)
            messages.append(
                {"role": "tool", "tool_call_id": call_id(_field(item, "call_id", where)), "content": text}
            )
        elif kind == "reasoning":
            continue  # the model's earlier thinking is not fed back, as chat templates drop it too
        else:
            raise InvalidRequestError(
                f"{where}.type {kind!r} is not supported; use message, function_call or function_call_output.",
                param=f"{where}.type",
            )
    return messages


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = _ROLES.get(item.get("role", ""))
    if role is None:
        raise InvalidRequestError(
            f"{where}.role must be one of {', '.join(_ROLES)}, got {item.get('role')!r}.",
            param=f"{where}.role",
        )
    content = item.get("content")
    if isinstance(content, list):
        content = _parts(content, where)
    if not isinstance(content, (str, list)):
        raise InvalidRequestError(
            f"{where}.content must be a string or a list of text parts.", param=f"{where}.content"
        )
    return {"role": role, "content": content}


def _parts(content: list[Any], where: str) -> str | list[dict[str, Any]]:
    """Text parts joined into one string; with an input_image, the chat form's text and image_url parts
    (the vision code reads the pictures and refuses them for a text-only model)."""
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            parts.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
        elif kind == "input_image":
            raise InvalidRequestError(
                f"{where}.content[{j}] needs an image_url (a data:image/...;base64 URL); file_id is not "
                "supported.",
                param=f"{where}.content[{j}]",
            )
        else:
            raise InvalidRequestError(
                f"{where}.content[{j}] must be a text part ({{'type': 'input_text', 'text': ...}}) or, for "
                "vision models, an input_image part.",
                param=f"{where}.content[{j}]",
            )
    if all(p["type"] == "text" for p in parts):
        return "\n".join(p["text"] for p in parts)
    return parts


def _field(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise InvalidRequestError(f"{where}.{key} must be a non-empty string.", param=f"{where}.{key}")
    return value


def _arguments(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except ValueError:
            return arguments
        return parsed if isinstance(parsed, dict) else arguments
    return arguments if isinstance(arguments, dict) else {}


def as_chat_request(req: ResponsesRequest) -> ChatCompletionRequest:
    """A chat request holding the tool fields, so the chat path validates and plans them."""
    tools = []
    for i, tool in enumerate(req.tools or []):
        if tool.get("type") != "function":
            raise InvalidRequestError(
                f"tools[{i}].type {tool.get('type')!r} is not supported; only function tools are.",
                param=f"tools[{i}].type",
            )
        try:
            fn = msgspec.convert({k: v for k, v in tool.items() if k != "type"}, FunctionDef)
        except msgspec.ValidationError as exc:
            raise InvalidRequestError(f"Invalid tools[{i}]: {exc}.", param=f"tools[{i}]") from None
        tools.append(Tool("function", fn))
    choice = req.tool_choice
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        choice = {"type": "function", "function": {"name": choice["name"]}}
    return ChatCompletionRequest(
        messages=[],
        tools=tools,  # [] rather than None: the server's own MCP tools are not offered here
        tool_choice=choice,
        parallel_tool_calls=req.parallel_tool_calls,
        response_format=response_format(req.text),
        reasoning_effort=(req.reasoning or {}).get("effort"),  # checked, and made template kwargs, there
    )


def response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """`text.format` in the chat API's `response_format` shape."""
    fmt = (text or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise InvalidRequestError("'text.format' must be an object.", param="text.format")
    if fmt.get("type") == "json_schema":
        inner = {k: v for k, v in fmt.items() if k in ("name", "schema", "strict", "description")}
        return {"type": "json_schema", "json_schema": inner}
    return {"type": fmt.get("type")}
