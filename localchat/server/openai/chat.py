"""POST /v1/chat/completions: template the conversation, run n choices, answer in one JSON or as SSE."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from litestar import Request, Response, post
from litestar.response import Stream

from localchat.errors import InvalidRequestError
from localchat.server.common import (
    collect_or_abort,
    finish_reason,
    loop_stop_field,
    model_context,
    new_call,
    usage,
    usage_of,
)
from localchat.server.openai import mcp_chat
from localchat.server.openai.chat_input import chat_logprobs_k, template_messages
from localchat.server.openai.chat_output import ChoiceDeltas, message_of
from localchat.server.openai.chat_tools import ToolPlan, plan_tools, request_constraint
from localchat.server.openai.mcp_chat import McpConversation
from localchat.server.openapi import api_operation
from localchat.server.sse import KEEPALIVE, KEEPALIVE_S, SSE_HEADERS, ListEvents, event, guarded
from localchat.serving.context import ServerContext
from localchat.serving.generation import (
    Generation,
    build_params,
    check_n,
    resolve_max_tokens,
)
from localchat.serving.logprobs import chat_logprobs
from localchat.serving.reasoning import starts_in_reasoning
from localchat.serving.schemas import ChatCompletionRequest, decode_request
from localchat.serving.structured_input import response_constraint
from localchat.vision.chat_prompt import chat_prompt_with_images
from localchat.vision.request_images import has_images

# Keywords render() owns; chat_template_kwargs may not override them.
_RESERVED_TEMPLATE_KWARGS = frozenset(
    {"messages", "tools", "documents", "add_generation_prompt", "bos_token", "eos_token", "flatten_content"}
)


@dataclass(slots=True)
class ChatCall:
    ctx: ServerContext
    id: str
    created: int
    n: int
    logprobs_k: int | None
    in_reasoning: bool  # the prompt opened a <think> block the answer continues
    include_usage: bool
    tools: ToolPlan

    def choice_deltas(self) -> ChoiceDeltas:
        return ChoiceDeltas(self.in_reasoning, self.tools.new_stream())

    def header(self, obj: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.ctx.model_id,
            "system_fingerprint": self.ctx.system_fingerprint,
        }


@post(
    ["/v1/chat/completions", "/chat/completions"],
    name="openai:chat",
    status_code=200,
    operation_class=api_operation(ChatCompletionRequest),
)
async def chat_completions(request: Request[Any, Any, Any]) -> Response[Any] | Stream:
    req = decode_request(await request.body(), ChatCompletionRequest)
    ctx = await model_context(request, req.model)
    n = check_n(req.n)
    logprobs_k = chat_logprobs_k(req)
    tools = plan_tools(ctx, req)
    messages = template_messages(req, ctx.tool_parser.template_call_id)
    extra = {k: v for k, v in (req.chat_template_kwargs or {}).items() if k not in _RESERVED_TEMPLATE_KWARGS}
    if tools.mcp_names and has_images(messages):
        raise InvalidRequestError(
            "Pictures and MCP tools in one request are not supported yet; send the picture without MCP tools.",
            param="messages",
        )
    # Pictures are read, checked and paired with their image tokens here, off the event loop.
    prompt_text, prompt_ids, images = await chat_prompt_with_images(
        ctx, messages, tools.template_tools, **extra
    )
    if req.max_completion_tokens is not None:
        max_tokens = resolve_max_tokens(ctx, req.max_completion_tokens, "max_completion_tokens")
    else:
        max_tokens = resolve_max_tokens(ctx, req.max_tokens)
    constraint = await request_constraint(ctx, tools, req.response_format, req.parallel_tool_calls)
    params = build_params(ctx, req, max_tokens=max_tokens, logprobs=logprobs_k, n=n, constraint=constraint)
    call_id, created = new_call("chatcmpl")
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    in_reasoning = starts_in_reasoning(prompt_text)
    call = ChatCall(ctx, call_id, created, n, logprobs_k, in_reasoning, include_usage, tools)
    if tools.mcp_names:  # the server runs the model's calls and goes on (turns re-render the prompt)
        later = await response_constraint(ctx, req.response_format)
        conv = McpConversation(call, messages, extra, params[0], later)
        if req.stream:
            return Stream(guarded(mcp_chat.stream(conv)), media_type="text/event-stream", headers=SSE_HEADERS)
        return await mcp_chat.respond(request, conv)
    gen = Generation(ctx.engine, call_id, [(prompt_ids, p) for p in params], images)
    if req.stream:
        return Stream(guarded(_stream(call, gen)), media_type="text/event-stream", headers=SSE_HEADERS)
    results = await collect_or_abort(request, gen, n)
    if results is None:
        return Response(b"", status_code=499)
    choices = []
    for i, r in enumerate(results):
        reason = finish_reason(r.finish_reason, r.error)
        output = call.choice_deltas()
        message = message_of(output.push(r.text) + output.flush())
        if output.num_calls and reason == "stop":
            reason = "tool_calls"
        lp = (
            {"content": chat_logprobs(ctx.token_texts, r.logprobs, logprobs_k), "refusal": None}
            if logprobs_k is not None
            else None
        )
        choice = {"index": i, "message": message, "logprobs": lp, "finish_reason": reason}
        choices.append(choice | loop_stop_field(r.stop_reason))
    body = call.header("chat.completion") | {"choices": choices, "usage": usage_of(results, n)}
    return Response(body, media_type="application/json")


async def _stream(call: ChatCall, gen: Generation) -> AsyncIterator[bytes]:
    head = call.header("chat.completion.chunk")
    tail = {"usage": None} if call.include_usage else {}
    choice_event = ListEvents(head, "choices", tail)  # = event(head | {"choices": [choice]} | tail)
    outputs = [call.choice_deltas() for _ in range(call.n)]
    prompt_tokens = cached_tokens = 0
    completion = [0] * call.n

    def chunk(
        index: int, delta: dict[str, Any], reason: str | None = None, logprobs: Any = None, extra: Any = None
    ) -> bytes:
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}
        return choice_event(choice | extra if extra else choice)

    try:
        yield b"".join(chunk(i, {"role": "assistant", "content": ""}) for i in range(call.n))
        async for batch in gen.batches(KEEPALIVE_S):
            if not batch:
                yield KEEPALIVE
                continue
            parts = []
            for index, out in batch:
                reason = finish_reason(out.finish_reason, out.error) if out.finished else None
                deltas = outputs[index].push(out.text_delta)
                if out.finished:
                    deltas += outputs[index].flush()
                    if reason == "stop" and outputs[index].num_calls:
                        reason = "tool_calls"
                logprobs = None
                if call.logprobs_k is not None and out.logprobs:
                    logprobs = {
                        "content": chat_logprobs(call.ctx.token_texts, out.logprobs, call.logprobs_k),
                        "refusal": None,
                    }
                    deltas = deltas or [{"content": ""}]
                for j, delta in enumerate(deltas):
                    parts.append(chunk(index, delta, None, logprobs if j == 0 else None))
                if reason is not None:
                    parts.append(chunk(index, {}, reason, extra=loop_stop_field(out.stop_reason)))
                completion[index] = out.num_output_tokens
                if index == 0:
                    prompt_tokens, cached_tokens = out.num_prompt_tokens, out.num_cached_tokens
            yield b"".join(parts)
        if call.include_usage:
            yield event(head | {"choices": [], "usage": usage(prompt_tokens, sum(completion), cached_tokens)})
    finally:
        gen.close()
