"""Checks a chat request's messages and tools, and turns them into what the chat template reads."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from localchat.errors import InvalidRequestError
from localchat.serving.schemas import ChatCompletionRequest, ChatMessage, Tool

ROLES = ("system", "developer", "user", "assistant", "tool")
_FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_TOOL_CHOICES = ("none", "auto", "required")


def template_messages(
    req: ChatCompletionRequest, call_id: Callable[[str], str] = str
) -> list[dict[str, Any]]:
    """`call_id` rewrites tool-call ids the way the model's template wants them (Mistral: 9 characters)."""
    if not req.messages:
        raise InvalidRequestError("'messages' must hold at least one message.", param="messages")
    return [_message(i, m, call_id) for i, m in enumerate(req.messages)]


def _message(i: int, m: ChatMessage, call_id: Callable[[str], str] = str) -> dict[str, Any]:
    where = f"messages[{i}]"
    if m.role not in ROLES:
        raise InvalidRequestError(
            f"Invalid role {m.role!r} in {where}; use one of {', '.join(ROLES)}.", param=f"{where}.role"
        )
    content = _content(m.content, where)
    if content is None and not (m.role == "assistant" and m.tool_calls):
        raise InvalidRequestError(f"{where} ({m.role}) needs 'content'.", param=f"{where}.content")
    # Templates know "system"; "developer" is OpenAI's newer name for it.
    out: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": content or ""}
    if m.name is not None:
        out["name"] = m.name
    if m.tool_call_id is not None:
        out["tool_call_id"] = call_id(m.tool_call_id)
    if m.reasoning_content is not None or m.reasoning is not None:
        out["reasoning_content"] = m.reasoning_content if m.reasoning_content is not None else m.reasoning
    if m.tool_calls:
        out["tool_calls"] = [
            {
                "id": None if c.id is None else call_id(c.id),
                "type": c.type or "function",
                "function": {"name": c.function.name, "arguments": _arguments(c.function.arguments)},
            }
            for c in m.tool_calls
        ]
    return out


def _content(content: Any, where: str) -> str | list[dict[str, Any]] | None:
    """A string; or, when the parts hold a picture, the list of text and image_url parts (the vision
    code reads the pictures and refuses them for a text-only model)."""
    if content is None or isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        if part.type == "text" and part.text is not None:
            parts.append({"type": "text", "text": part.text})
        elif part.type == "image_url":
            parts.append({"type": "image_url", "image_url": part.image_url})
        else:
            raise InvalidRequestError(
                f"{where}.content[{j}] is a {part.type!r} part; messages take text parts "
                '({"type": "text", "text": "..."}) and, for vision models, image_url parts.',
                param=f"{where}.content[{j}]",
            )
    if all(p["type"] == "text" for p in parts):
        return "\n".join(p["text"] for p in parts)
    return parts


def _arguments(arguments: str | dict[str, Any] | None) -> dict[str, Any] | str:
    # Templates expect a mapping (HF convention); OpenAI clients send a JSON string.
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except ValueError:
            return arguments
        return parsed if isinstance(parsed, dict) else arguments
    return arguments or {}


def template_tools(req: ChatCompletionRequest) -> list[dict[str, Any]] | None:
    """Validated tool definitions for the template; None when there are none or tool_choice is "none"."""
    names = [_check_tool(i, t) for i, t in enumerate(req.tools or [])]
    choice = req.tool_choice
    if isinstance(choice, str) and choice not in _TOOL_CHOICES:
        raise InvalidRequestError(
            f"'tool_choice' must be one of {', '.join(_TOOL_CHOICES)} or a function object.",
            param="tool_choice",
        )
    if isinstance(choice, dict):
        name = (
            (choice.get("function") or {}).get("name") if isinstance(choice.get("function"), dict) else None
        )
        if choice.get("type") != "function" or name not in names:
            raise InvalidRequestError(
                "'tool_choice' must name one of the request's tools: "
                '{"type": "function", "function": {"name": "..."}}.',
                param="tool_choice",
            )
    if choice is not None and not req.tools and choice != "none":
        raise InvalidRequestError("'tool_choice' is set but 'tools' is empty.", param="tool_choice")
    if not req.tools or choice == "none":
        return None
    return [
        {
            "type": "function",
            "function": {
                k: v
                for k, v in (
                    ("name", t.function.name),
                    ("description", t.function.description),
                    ("parameters", t.function.parameters),
                )
                if v is not None
            },
        }
        for t in req.tools
    ]


def _check_tool(i: int, tool: Tool) -> str:
    where = f"tools[{i}]"
    if tool.type != "function":
        raise InvalidRequestError(
            f'{where}.type must be "function", got {tool.type!r}.', param=f"{where}.type"
        )
    name = tool.function.name
    if not _FUNCTION_NAME.match(name):
        raise InvalidRequestError(
            f"{where}.function.name {name!r} is invalid: use 1-64 letters, digits, '_', '-' or '.'.",
            param=f"{where}.function.name",
        )
    params = tool.function.parameters
    if params is not None and params.get("type", "object") != "object":
        raise InvalidRequestError(
            f'{where}.function.parameters must be a JSON Schema of type "object".',
            param=f"{where}.function.parameters",
        )
    if params is not None and not isinstance(params.get("properties", {}), dict):
        raise InvalidRequestError(
            f"{where}.function.parameters.properties must be an object.", param=f"{where}.function.parameters"
        )
    return name


def chat_logprobs_k(req: ChatCompletionRequest) -> int | None:
    if req.top_logprobs is not None and not req.logprobs:
        raise InvalidRequestError("'top_logprobs' needs 'logprobs': true.", param="top_logprobs")
    if not req.logprobs:
        return None
    k = req.top_logprobs or 0
    if not 0 <= k <= 20:
        raise InvalidRequestError(f"'top_logprobs' must be between 0 and 20, got {k}.", param="top_logprobs")
    return k
