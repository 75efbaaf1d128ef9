"""Which tools a chat request offers the model and how its calls are read back: legacy `functions`
mapped onto `tools`, `tool_choice`, `parallel_tool_calls`, and the model's tool-call parser."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from localchat.errors import InvalidRequestError
from localchat.mcp.trust import check_api_caller
from localchat.server.openai.chat_input import template_tools
from localchat.serving.schemas import ChatCompletionRequest, Tool
from localchat.serving.structured_input import (
    harmony_choice_constraint,
    response_constraint,
    tool_choice_constraint,
)
from localchat.serving.tool_parsers import ToolCallStream, ToolParser

if TYPE_CHECKING:
    from localchat.engine.constraint import Constraint
    from localchat.serving.context import ServerContext


@dataclass(slots=True)
class ToolPlan:
    template_tools: list[dict[str, Any]] | None  # what the chat template renders; None: no tools
    parser: ToolParser | None  # None: the reply is all text (no tools, or tool_choice "none")
    choice: str | dict[str, Any]  # "auto" | "required" | "none" | {"type": "function", ...}
    names: set[str] = field(default_factory=set)
    max_calls: int | None = None  # 1 when parallel_tool_calls is false
    mcp_names: set[str] = field(default_factory=set)  # tools the server runs itself (--mcp-config)

    def new_stream(self) -> ToolCallStream | None:
        return None if self.parser is None else ToolCallStream(self.parser, self.names, self.max_calls)


def map_legacy_functions(req: ChatCompletionRequest) -> None:
    """`functions` / `function_call` (OpenAI's API before `tools`) become `tools` / `tool_choice`."""
    if req.functions is None and req.function_call is None:
        return
    if req.tools is not None or req.tool_choice is not None:
        raise InvalidRequestError(
            "Send either 'tools'/'tool_choice' or the legacy 'functions'/'function_call', not both.",
            param="functions",
        )
    req.tools = [Tool("function", f) for f in req.functions or []]
    call = req.function_call
    if isinstance(call, dict):
        req.tool_choice = {"type": "function", "function": {"name": call.get("name")}}
    else:
        req.tool_choice = call


def plan_tools(ctx: ServerContext, req: ChatCompletionRequest) -> ToolPlan:
    map_legacy_functions(req)
    mcp_tools = _mcp_tools(ctx, req)
    if mcp_tools:  # validated like the request's own (tool_choice may name one of them)
        req.tools = msgspec.convert(mcp_tools, list[Tool])
    tools = template_tools(req)
    choice = req.tool_choice if req.tool_choice is not None else "auto"
    if tools is None:
        # harmony output needs its reader even without tools: its channels hold the reasoning
        parser = ctx.tool_parser if ctx.tool_parser.keeps_special_tokens else None
        return ToolPlan(None, parser, "none" if choice == "none" else choice)
    names = {t["function"]["name"] for t in tools}
    max_calls = 1 if req.parallel_tool_calls is False else None
    mcp_names = names if mcp_tools else set()
    return ToolPlan(tools, ctx.tool_parser, choice, names, max_calls, mcp_names)


def _mcp_tools(ctx: ServerContext, req: ChatCompletionRequest) -> list[dict[str, Any]]:
    # MCP tools join requests that bring no tools of their own; `tools: []` opts out. The server
    # runs them turn by turn for one answer, so not with n > 1 or logprobs.
    if ctx.mcp is None or req.tools is not None or req.tool_choice == "none":
        return []
    if (req.n or 1) > 1 or req.logprobs:
        return []
    tools = list(ctx.mcp.openai_tools())
    if tools:  # the request would make the server run tools: only for a caller it trusts
        check_api_caller(ctx.settings)
    return tools


async def request_constraint(
    ctx: ServerContext,
    plan: ToolPlan,
    response_format: dict[str, Any] | None,
    parallel_tool_calls: bool | None,
    format_param: str = "response_format",
) -> Constraint | None:
    """What the output must follow: a forced call (`tool_choice` "required" or named), wrapped in the
    model's own tool-call markup; else `response_format`'s grammar; else nothing."""
    forced = plan.choice == "required" or isinstance(plan.choice, dict)
    if plan.parser is not None and plan.parser.keeps_special_tokens and plan.template_tools and forced:
        # harmony: a call is a message addressed to the function, its header written in special tokens
        return await harmony_choice_constraint(ctx, plan.template_tools, plan.choice)
    if plan.parser is not None and plan.parser.can_force and plan.template_tools and forced:
        # NOTE: one call unless parallel calls are asked for explicitly: given the choice, small models
        # repeat the same call until max_tokens.
        parallel = parallel_tool_calls is True and plan.choice == "required"
        parser = plan.parser
        wrapper = (parser.forced_prefix, parser.forced_suffix, parser.arguments_key)
        return await tool_choice_constraint(ctx, plan.template_tools, plan.choice, wrapper, parallel=parallel)
    return await response_constraint(ctx, response_format, format_param)
