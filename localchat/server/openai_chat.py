"""POST /v1/chat/completions: template the conversation, run n choices, answer in one JSON or as SSE."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from litestar import Request, Response, post
from litestar.response import Stream

from localchat.server.chat_input import (
    chat_logprobs_k,
    check_response_format,
    template_messages,
    template_tools,
)
from localchat.server.common import (
    check_accepting,
    check_model,
    collect_or_abort,
    finish_reason,
    get_ctx,
    new_call,
    usage,
    usage_of,
)
from localchat.server.context import ServerContext
from localchat.server.generation import (
    Generation,
    build_params,
    check_n,
    check_prompt_length,
    resolve_max_tokens,
)
from localchat.server.logprobs import chat_logprobs
from localchat.server.openapi import api_operation
from localchat.server.reasoning import ReasoningSplitter, split_reasoning, starts_in_reasoning
from localchat.server.schemas import ChatCompletionRequest, decode_request
from localchat.server.sse import KEEPALIVE, KEEPALIVE_S, SSE_HEADERS, event, guarded

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

    def header(self, obj: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.ctx.model_id,
            "system_fingerprint": None,
        }


@post(
    ["/v1/chat/completions", "/chat/completions"],
    name="openai:chat",
    status_code=200,
    operation_class=api_operation(ChatCompletionRequest),
)
async def chat_completions(request: Request[Any, Any, Any]) -> Response[Any] | Stream:
    ctx = get_ctx(request)
    check_accepting(ctx)
    req = decode_request(await request.body(), ChatCompletionRequest)
    check_model(ctx, req.model)
    n = check_n(req.n)
    logprobs_k = chat_logprobs_k(req)
    check_response_format(req.response_format)
    messages = template_messages(req)
    tools = template_tools(req)
    extra = {k: v for k, v in (req.chat_template_kwargs or {}).items() if k not in _RESERVED_TEMPLATE_KWARGS}
    prompt_text = ctx.render_chat(messages, tools, **extra)
    prompt_ids = ctx.model.tokenizer.encode(prompt_text, add_special_tokens=False)
    check_prompt_length(ctx, len(prompt_ids))
    if req.max_completion_tokens is not None:
        max_tokens = resolve_max_tokens(ctx, req.max_completion_tokens, "max_completion_tokens")
    else:
        max_tokens = resolve_max_tokens(ctx, req.max_tokens)
    params = build_params(ctx, req, max_tokens=max_tokens, logprobs=logprobs_k, n=n)
    call_id, created = new_call("chatcmpl")
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    call = ChatCall(ctx, call_id, created, n, logprobs_k, starts_in_reasoning(prompt_text), include_usage)
    gen = Generation(ctx.engine, call_id, [(prompt_ids, p) for p in params])
    if req.stream:
        return Stream(guarded(_stream(call, gen)), media_type="text/event-stream", headers=SSE_HEADERS)
    results = await collect_or_abort(request, gen, n)
    if results is None:
        return Response(b"", status_code=499)
    choices = []
    for i, r in enumerate(results):
        reason = finish_reason(r.finish_reason, r.error)
        reasoning, content = split_reasoning(r.text, call.in_reasoning)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if reasoning:
            message["reasoning_content"] = message["reasoning"] = reasoning
        lp = (
            {"content": chat_logprobs(ctx.token_texts, r.logprobs, logprobs_k), "refusal": None}
            if logprobs_k is not None
            else None
        )
        choices.append({"index": i, "message": message, "logprobs": lp, "finish_reason": reason})
    body = call.header("chat.completion") | {"choices": choices, "usage": usage_of(results, n)}
    return Response(body, media_type="application/json")


async def _stream(call: ChatCall, gen: Generation) -> AsyncIterator[bytes]:
    head = call.header("chat.completion.chunk")
    tail = {"usage": None} if call.include_usage else {}
    splitters = [ReasoningSplitter(call.in_reasoning) for _ in range(call.n)]
    prompt_tokens = cached_tokens = 0
    completion = [0] * call.n

    def chunk(index: int, delta: dict[str, Any], reason: str | None = None, logprobs: Any = None) -> bytes:
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}
        return event(head | {"choices": [choice]} | tail)

    try:
        yield b"".join(chunk(i, {"role": "assistant", "content": ""}) for i in range(call.n))
        async for batch in gen.batches(KEEPALIVE_S):
            if not batch:
                yield KEEPALIVE
                continue
            parts = []
            for index, out in batch:
                reason = finish_reason(out.finish_reason, out.error) if out.finished else None
                reasoning, content = splitters[index].push(out.text_delta)
                if out.finished:
                    r_tail, c_tail = splitters[index].flush()
                    reasoning, content = reasoning + r_tail, content + c_tail
                delta: dict[str, Any] = {}
                if reasoning:
                    delta["reasoning_content"] = delta["reasoning"] = reasoning
                if content:
                    delta["content"] = content
                logprobs = None
                if call.logprobs_k is not None and out.logprobs:
                    logprobs = {
                        "content": chat_logprobs(call.ctx.token_texts, out.logprobs, call.logprobs_k),
                        "refusal": None,
                    }
                    delta.setdefault("content", "")
                if delta:
                    parts.append(chunk(index, delta, None, logprobs))
                if reason is not None:
                    parts.append(chunk(index, {}, reason))
                completion[index] = out.num_output_tokens
                if index == 0:
                    prompt_tokens, cached_tokens = out.num_prompt_tokens, out.num_cached_tokens
            yield b"".join(parts)
        if call.include_usage:
            yield event(head | {"choices": [], "usage": usage(prompt_tokens, sum(completion), cached_tokens)})
    finally:
        gen.close()
