"""An answer the web UI is generating: its state while the engine writes it, the tabs listening to it, the
MCP call it waits on the user for, and the calls a model turn made."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from localchat.mcp import ui_turns
from localchat.serving.harmony import HarmonyThinkText
from localchat.serving.tool_parsers import ParsedCall

if TYPE_CHECKING:
    from localchat.serving.context import ServerContext


@dataclass(slots=True)
class Approval:
    """An MCP call the model made, waiting for the user's Allow / Deny in the web UI."""

    id: str
    server: str
    name: str
    arguments: str
    decided: asyncio.Future[str]  # "allow" | "deny" | "always" | "stop"


@dataclass(slots=True)
class ActiveAnswer:
    """An answer the web UI is generating into a stored conversation (serving.generation.Generation is
    an API request's choices)."""

    conversation_id: str
    message_id: int
    req_id: str
    ctx: ServerContext  # the model writing the answer (stop aborts there; tool calls continue there)
    text: str = ""
    started_at: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    saved_at: float = field(default_factory=time.monotonic)
    listeners: list[asyncio.Queue[tuple[str, str]]] = field(default_factory=list)
    turn_start: int = 0  # where the current model turn's text begins (after MCP tool runs)
    turns: int = 0
    stop_requested: bool = False  # Stop pressed, maybe while MCP tools ran between two model turns
    approval: Approval | None = None  # the MCP call waiting for the user, if any
    # gpt-oss (harmony): the model turn's channels rewritten as the `<think>` form answers are stored in
    harmony: HarmonyThinkText | None = None


def harmony_reader(ctx: ServerContext, tools: list[dict[str, Any]] | None) -> HarmonyThinkText | None:
    """A fresh reader per model turn for a model whose output keeps its special tokens (harmony); calls
    to the offered MCP tools are kept aside for `turn_calls`."""
    if not ctx.tool_parser.keeps_special_tokens:
        return None
    return HarmonyThinkText({t["function"]["name"] for t in tools or ()})


def turn_calls(gen: ActiveAnswer) -> tuple[str, list[ParsedCall]]:
    """(the model turn's text without its calls, the MCP calls it made)."""
    turn = gen.text[gen.turn_start :]
    if gen.harmony is None:
        return ui_turns.find_calls(gen.ctx, turn)
    # harmony calls are messages to `functions.NAME`, read as they streamed: the text already lacks them
    parser = gen.ctx.tool_parser
    return turn, [ParsedCall(parser.new_call_id(), name, args) for name, args in gen.harmony.calls]


def tell(gen: ActiveAnswer, event: tuple[str, str]) -> None:
    for queue in gen.listeners:
        queue.put_nowait(event)
