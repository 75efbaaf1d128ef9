"""MCP tool runs inside the web UI's answers. An answer that calls MCP tools is stored as one text:
the model's words, then per call a canonical `<tool_call>` block and a `<tool_response>` block with
the result, then the rest of the answer. The browser shows those blocks collapsed; the next prompt
turns them back into assistant tool calls and tool messages for the chat template."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from localchat.serving.tool_parsers import ParsedCall, parse

if TYPE_CHECKING:
    from localchat.mcp.hub import ToolRun
    from localchat.serving.context import ServerContext

MAX_TURNS = 6
_BLOCKS = re.compile(
    r"<tool_call>\s*(?P<call>.*?)\s*</tool_call>\s*"
    r'<tool_response name="[^"]*"(?P<error> error="true")?(?: denied="true")?>\n(?P<result>.*?)\n</tool_response>\s*',
    re.S,
)


def mcp_tools(ctx: ServerContext) -> list[dict[str, Any]] | None:
    tools = ctx.mcp.openai_tools() if ctx.mcp is not None else []
    return tools or None


def find_calls(ctx: ServerContext, turn_text: str) -> tuple[str, list[ParsedCall]]:
    """(the turn's text without call markup, its calls) when it calls MCP tools, else (text, [])."""
    tools = mcp_tools(ctx)
    if tools is None:
        return turn_text, []
    names = {t["function"]["name"] for t in tools}
    out = parse(ctx.tool_parser, turn_text, names)
    if not out.calls or any(c.name not in names for c in out.calls):
        return turn_text, []
    return out.content, out.calls


def transcript(content: str, calls: list[ParsedCall], runs: list[ToolRun]) -> str:
    parts = [content.rstrip() + "\n\n" if content.strip() else ""]
    for call, run in zip(calls, runs, strict=True):
        body = json.dumps({"name": call.name, "arguments": _loads(call.arguments)}, ensure_ascii=False)
        error = ' error="true"' if run.is_error else ""
        error += ' denied="true"' if run.denied else ""  # the UI shows it as "Denied", not as a failure
        # A result cannot close its own block early (it is foreign text).
        text = run.text.replace("</tool_response>", "</tool_response\u200b>")
        parts.append(
            f"<tool_call>\n{body}\n</tool_call>\n"
            f'<tool_response name="{_attr(call.name)}"{error}>\n{text}\n</tool_response>\n\n'
        )
    return "".join(parts)


def answer_messages(text: str, call_id: Callable[[str], str] = str) -> list[dict[str, Any]]:
    """A stored answer as template messages: assistant turns with tool calls, tool results, the rest."""
    messages: list[dict[str, Any]] = []
    at = 0
    for n, block in enumerate(_BLOCKS.finditer(text)):
        call = _loads(block["call"])
        if not isinstance(call, dict):
            continue
        before = text[at : block.start()].strip()
        ident = call_id(f"call_ui{n}")
        tool_call = {
            "id": ident,
            "type": "function",
            "function": {"name": call.get("name"), "arguments": call.get("arguments", {})},
        }
        last = messages[-1] if messages else None
        if (
            last is not None
            and last["role"] == "assistant"
            and not before
            and last.get("tool_calls")
            and at == block.start()
        ):
            last["tool_calls"].append(tool_call)
        else:
            messages.append({"role": "assistant", "content": before, "tool_calls": [tool_call]})
        result = block["result"]
        messages.append(
            {
                "role": "tool",
                "tool_call_id": ident,
                "content": f"Error: {result}" if block["error"] else result,
            }
        )
        at = block.end()
    rest = text[at:].strip()
    if rest or not messages:
        messages.append({"role": "assistant", "content": rest})
    return messages


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _attr(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.\-]", "_", name)
