"""POST /v1/responses: OpenAI's Responses API, stateless apart from `previous_response_id` (kept in
memory). It runs the chat path (template, tools, reasoning split) and answers with output items, or
streams the documented events (response.created … response.completed)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
from litestar import Request, Response, post
from litestar.response import Stream

from localchat.engine.outputs import RequestOutput
from localchat.errors import InvalidRequestError
from localchat.server.common import (
    collect_or_abort,
    finish_reason,
    model_context,
    new_call,
)
from localchat.server.openai.chat_output import ChoiceDeltas
from localchat.server.openai.chat_tools import plan_tools, request_constraint
from localchat.server.openai.responses_input import ResponsesRequest, as_chat_request, input_messages
from localchat.server.openai.responses_output import ResponseWriter
from localchat.server.openapi import api_operation
from localchat.server.sse import KEEPALIVE, KEEPALIVE_S, SSE_HEADERS, guarded
from localchat.serving.generation import Generation, build_params, resolve_max_tokens
from localchat.serving.reasoning import starts_in_reasoning
from localchat.serving.schemas import decode_request
from localchat.vision.chat_prompt import chat_prompt_with_images

_encode = msgspec.json.Encoder().encode


@post(
    ["/v1/responses", "/responses"],
    name="openai:responses",
    status_code=200,
    operation_class=api_operation(ResponsesRequest),
)
async def responses(request: Request[Any, Any, Any]) -> Response[Any] | Stream:
    req = decode_request(await request.body(), ResponsesRequest)
    ctx = await model_context(request, req.model)
    if req.n not in (None, 1):
        raise InvalidRequestError("The Responses API generates one answer; 'n' must be 1.", param="n")
    chat_req = as_chat_request(req)
    tools = plan_tools(ctx, chat_req)
    constraint = await request_constraint(
        ctx, tools, chat_req.response_format, req.parallel_tool_calls, "text.format"
    )
    call_id = ctx.tool_parser.template_call_id
    history = ctx.responses.conversation(req.previous_response_id) if req.previous_response_id else []
    conversation = history + input_messages(req, call_id)
    system = [{"role": "system", "content": req.instructions}] if req.instructions else []
    prompt_text, prompt_ids, images = await chat_prompt_with_images(
        ctx,
        system + conversation,
        tools.template_tools,
        param="input",
        **(chat_req.chat_template_kwargs or {}),
    )
    max_tokens = resolve_max_tokens(ctx, req.max_output_tokens, "max_output_tokens")
    (params,) = build_params(ctx, req, max_tokens=max_tokens, logprobs=None, n=1, constraint=constraint)
    _, created = new_call("resp")
    response_id = f"resp_{uuid.uuid4().hex}"  # OpenAI's ids use "_"; clients may check the prefix
    writer = ResponseWriter(
        _skeleton(ctx.model_id, response_id, created, req, params.temperature, params.top_p)
    )
    deltas = ChoiceDeltas(starts_in_reasoning(prompt_text), tools.new_stream())

    def remember() -> None:
        if req.store is not False:
            ctx.responses.put(response_id, conversation + writer.conversation_turn(call_id))

    gen = Generation(ctx.engine, response_id, [(prompt_ids, params)], images)
    if req.stream:
        events = _stream(writer, deltas, gen, remember)
        return Stream(guarded(events), media_type="text/event-stream", headers=SSE_HEADERS)
    results = await collect_or_abort(request, gen, 1)
    if results is None:
        return Response(b"", status_code=499)
    (r,) = results
    reason = finish_reason(r.finish_reason, r.error)
    writer.push(deltas.push(r.text) + deltas.flush())
    final = writer.finish(
        _usage(r.num_prompt_tokens, r.num_output_tokens, r.num_cached_tokens), reason == "length"
    )
    remember()
    return Response(final[-1]["response"], media_type="application/json")


async def _stream(
    writer: ResponseWriter, deltas: ChoiceDeltas, gen: Generation, remember: Callable[[], None]
) -> AsyncIterator[bytes]:
    try:
        yield _sse(writer.start())
        async for batch in gen.batches(KEEPALIVE_S):
            if not batch:
                yield KEEPALIVE
                continue
            for _, out in batch:
                yield _sse(_step(writer, deltas, out))
                if out.finished:
                    remember()
    finally:
        gen.close()


def _step(writer: ResponseWriter, deltas: ChoiceDeltas, out: RequestOutput) -> list[dict[str, Any]]:
    if not out.finished:
        return writer.push(deltas.push(out.text_delta))
    reason = finish_reason(out.finish_reason, out.error)  # an engine error raises: one error event
    events = writer.push(deltas.push(out.text_delta) + deltas.flush())
    usage = _usage(out.num_prompt_tokens, out.num_output_tokens, out.num_cached_tokens)
    return events + writer.finish(usage, reason == "length")


def _sse(events: list[dict[str, Any]]) -> bytes:
    # Like OpenAI's: an `event:` line naming the type, then the JSON.
    return b"".join(b"event: " + e["type"].encode() + b"\ndata: " + _encode(e) + b"\n\n" for e in events)


def _usage(prompt: int, output: int, cached: int) -> dict[str, Any]:
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + output,
    }


def _skeleton(
    model_id: str, response_id: str, created: int, req: ResponsesRequest, temperature: float, top_p: float
) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": "in_progress",
        "error": None,
        "incomplete_details": None,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "model": model_id,
        "output": [],
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": req.previous_response_id,
        # the effort asked for (it reaches the chat template); no summaries are written
        "reasoning": {"effort": (req.reasoning or {}).get("effort"), "summary": None},
        "store": req.store is not False,
        "temperature": temperature,
        "text": req.text or {"format": {"type": "text"}},
        "tool_choice": req.tool_choice or "auto",
        "tools": req.tools or [],
        "top_p": top_p,
        "truncation": "disabled",
        "usage": None,
        "user": req.user,
        "metadata": req.metadata or {},
    }
