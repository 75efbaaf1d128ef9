"""Chat requests that use the server's MCP tools: the server runs the model's calls itself and
continues the generation with their results (re-rendering the conversation), up to MAX_TURNS
turns; the last turn is rendered without tools so the model has to answer in text.

The client sees each run: streamed as `delta.mcp_tool_run` chunks (`status: "running"`, then
`"done"` with `result` and `is_error`), and non-streamed as `message.mcp_tool_runs`. Those calls are
never sent as `tool_calls`: the client has nothing to run.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from litestar import Request, Response

from localchat.server.common import collect_or_abort, finish_reason, usage
from localchat.server.openai.chat_output import ChoiceDeltas, message_of
from localchat.server.sse import KEEPALIVE, KEEPALIVE_S, event
from localchat.serving.generation import Generation
from localchat.serving.prompts import chat_prompt
from localchat.serving.reasoning import starts_in_reasoning

if TYPE_CHECKING:
    from localchat.engine.constraint import Constraint
    from localchat.engine.sampling_params import SamplingParams
    from localchat.server.openai.chat import ChatCall

MAX_TURNS = 6


@dataclass(slots=True)
class McpConversation:
    call: ChatCall
    messages: list[dict[str, Any]]
    template_kwargs: dict[str, Any]
    params: SamplingParams
    later_constraint: Constraint | None = None  # response_format's grammar, for the turns after the first
    runs: list[dict[str, Any]] = field(default_factory=list)
    totals: list[int] = field(default_factory=lambda: [0, 0, 0])  # prompt, completion, cached tokens

    async def turn(self, index: int) -> tuple[Generation, ChoiceDeltas, bool]:
        final = index == MAX_TURNS - 1
        ctx = self.call.ctx
        tools = None if final else self.call.tools.template_tools
        # Off the event loop, like every prompt (the tools' results can make it long).
        text, ids = await chat_prompt(ctx, self.messages, tools, **self.template_kwargs)
        # A forced call (tool_choice) binds the first turn only; later turns answer the results.
        params = self.params if index == 0 else replace(self.params, constraint=self.later_constraint)
        gen = Generation(ctx.engine, f"{self.call.id}-turn{index}", [(ids, params)])
        stream = None if final else self.call.tools.new_stream()
        return gen, ChoiceDeltas(starts_in_reasoning(text), stream), final

    def count(self, prompt: int, completion: int, cached: int) -> None:
        for i, n in enumerate((prompt, completion, cached)):
            self.totals[i] += n

    def usage(self) -> dict[str, Any]:
        return usage(*self.totals)

    async def run_calls(self, message: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Runs the message's calls, yielding each run as it starts and when done; then appends the
        assistant turn and the results to the conversation."""
        ctx = self.call.ctx
        assert ctx.mcp is not None
        call_id = ctx.tool_parser.template_call_id
        results = []
        for call in message["tool_calls"]:
            name, arguments = call["function"]["name"], call["function"]["arguments"]
            run = {"id": call["id"], "server": ctx.mcp.server_of(name), "name": name, "arguments": arguments}
            yield run | {"status": "running"}
            outcome = await ctx.mcp.call(name, arguments)
            run |= {"status": "done", "result": outcome.text, "is_error": outcome.is_error}
            self.runs.append(run)
            results.append(run)
            yield run
        self.messages.append(
            {
                "role": "assistant",
                "content": message["content"] or "",
                "tool_calls": [
                    {
                        "id": call_id(r["id"]),
                        "type": "function",
                        "function": {"name": r["name"], "arguments": _args(r["arguments"])},
                    }
                    for r in results
                ],
            }
        )
        for r in results:
            text = f"Error: {r['result']}" if r["is_error"] else r["result"]
            self.messages.append(
                {"role": "tool", "tool_call_id": call_id(r["id"]), "name": r["name"], "content": text}
            )


def _args(arguments: str) -> Any:
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    return value if isinstance(value, dict) else arguments


async def respond(request: Request[Any, Any, Any], conv: McpConversation) -> Response[Any]:
    content, reasoning = "", ""
    message: dict[str, Any] = {}
    reason = "stop"
    for index in range(MAX_TURNS):
        gen, output, _ = await conv.turn(index)
        results = await collect_or_abort(request, gen, 1)
        if results is None:
            return Response(b"", status_code=499)
        (r,) = results
        reason = finish_reason(r.finish_reason, r.error)
        conv.count(r.num_prompt_tokens, r.num_output_tokens, r.num_cached_tokens)
        message = message_of(output.push(r.text) + output.flush())
        content += message["content"] or ""
        reasoning += message.get("reasoning_content", "")
        if reason != "stop" or "tool_calls" not in message:
            break
        async for _ in conv.run_calls(message):
            pass
    message["content"] = content or (None if "tool_calls" in message else "")
    if reasoning:
        message["reasoning_content"] = message["reasoning"] = reasoning
    if conv.runs:
        message["mcp_tool_runs"] = conv.runs
    if "tool_calls" in message and reason == "stop":
        reason = "tool_calls"
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": reason}
    body = conv.call.header("chat.completion") | {"choices": [choice], "usage": conv.usage()}
    return Response(body, media_type="application/json")


async def stream(conv: McpConversation) -> AsyncIterator[bytes]:
    call = conv.call
    head = call.header("chat.completion.chunk")
    tail = {"usage": None} if call.include_usage else {}

    def chunk(delta: dict[str, Any], reason: str | None = None) -> bytes:
        return event(
            head
            | {"choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}]}
            | tail
        )

    yield chunk({"role": "assistant", "content": ""})
    for index in range(MAX_TURNS):
        gen, output, _ = await conv.turn(index)
        turn: list[dict[str, Any]] = []  # its call deltas are not sent: the server runs those calls
        reason = "stop"
        try:
            async for batch in gen.batches(KEEPALIVE_S):
                if not batch:
                    yield KEEPALIVE
                    continue
                parts = []
                for _, out in batch:
                    deltas = output.push(out.text_delta)
                    if out.finished:
                        reason = finish_reason(out.finish_reason, out.error)
                        deltas += output.flush()
                        conv.count(out.num_prompt_tokens, out.num_output_tokens, out.num_cached_tokens)
                    turn += deltas
                    parts += deltas
                yield b"".join(chunk(d) for d in parts if "tool_calls" not in d)
        finally:
            gen.close()
        message = message_of(turn)
        if reason != "stop" or "tool_calls" not in message:
            yield chunk({}, reason)
            break
        async for run in conv.run_calls(message):
            yield chunk({"mcp_tool_run": run})
    if call.include_usage:
        yield event(head | {"choices": [], "usage": conv.usage()})
