"""POST /v1/completions: raw prompts (text or token ids, one or many), n choices each."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from litestar import Request, Response, post
from litestar.response import Stream
from msgspec import UnsetType

from localchat.errors import InvalidRequestError
from localchat.server.common import (
    collect_or_abort,
    finish_reason,
    model_context,
    new_call,
    usage,
    usage_of,
)
from localchat.server.openapi import api_operation
from localchat.server.sse import KEEPALIVE, KEEPALIVE_S, SSE_HEADERS, event, guarded
from localchat.serving.context import ServerContext
from localchat.serving.generation import (
    Generation,
    build_params,
    check_n,
    check_prompt_length,
    resolve_max_tokens,
)
from localchat.serving.logprobs import completion_logprobs
from localchat.serving.prompts import encode_text
from localchat.serving.schemas import CompletionRequest, decode_request
from localchat.serving.structured_input import response_constraint

MAX_PROMPTS = 16
MAX_COMPLETION_LOGPROBS = 20


async def _prompts(
    ctx: ServerContext, prompt: str | list[Any] | UnsetType | None
) -> list[tuple[str, list[int]]]:
    """(text, token ids) per prompt. Accepts a string, a list of strings, token ids, or lists of ids;
    null is the start of a document (the BOS token, else the end-of-text token, as OpenAI's default)."""
    tok = ctx.model.tokenizer
    if isinstance(prompt, UnsetType):
        raise InvalidRequestError("Invalid request: missing required field 'prompt'.", param="prompt")
    if prompt is None:
        start = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_ids[0]
        prompt = [start]
    if isinstance(prompt, str):
        items: list[Any] = [prompt]
    elif prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        items = [prompt]
    else:
        items = prompt
    if not items:
        raise InvalidRequestError("'prompt' is empty.", param="prompt")
    if len(items) > MAX_PROMPTS:
        raise InvalidRequestError(f"At most {MAX_PROMPTS} prompts per request.", param="prompt")
    out = []
    vocab = getattr(tok, "vocab_size", None)
    for item in items:
        if isinstance(item, str):
            out.append((item, await encode_text(ctx, item)))
        elif (
            isinstance(item, list)
            and item
            and all(isinstance(t, int) and not isinstance(t, bool) for t in item)
        ):
            if any(t < 0 or (vocab is not None and t >= vocab) for t in item):
                raise InvalidRequestError("'prompt' holds token ids outside the vocabulary.", param="prompt")
            out.append((tok.decode(item, skip_special_tokens=False), list(item)))
        else:
            raise InvalidRequestError(
                "'prompt' must be a string, a list of strings, a list of token ids or a list of such lists.",
                param="prompt",
            )
    return out


def _check_unsupported(req: CompletionRequest, n: int) -> int | None:
    if req.suffix:
        raise InvalidRequestError("'suffix' (fill-in-the-middle) is not supported.", param="suffix")
    if req.best_of is not None and req.best_of != n:
        raise InvalidRequestError("'best_of' other than n is not supported.", param="best_of")
    if req.logprobs is not None and not 0 <= req.logprobs <= MAX_COMPLETION_LOGPROBS:
        raise InvalidRequestError(
            f"'logprobs' must be between 0 and {MAX_COMPLETION_LOGPROBS}, got {req.logprobs}.",
            param="logprobs",
        )
    if req.echo and req.logprobs is not None:
        raise InvalidRequestError(
            "'echo' together with 'logprobs' (prompt logprobs) is not supported.", param="echo"
        )
    return req.logprobs


@post(
    ["/v1/completions", "/completions"],
    name="openai:completions",
    status_code=200,
    operation_class=api_operation(CompletionRequest),
)
async def completions(request: Request[Any, Any, Any]) -> Response[Any] | Stream:
    req = decode_request(await request.body(), CompletionRequest)
    ctx = await model_context(request, req.model)
    n = check_n(req.n)
    logprobs_k = _check_unsupported(req, n)
    prompts = await _prompts(ctx, req.prompt)
    for _, ids in prompts:
        check_prompt_length(ctx, len(ids), "prompt")
    max_tokens = resolve_max_tokens(ctx, req.max_tokens if req.max_tokens is not None else 16)
    constraint = await response_constraint(ctx, req.response_format)
    params = build_params(
        ctx, req, max_tokens=max_tokens, logprobs=logprobs_k, n=len(prompts) * n, constraint=constraint
    )
    jobs = [(ids, params[p * n + i]) for p, (_, ids) in enumerate(prompts) for i in range(n)]
    call_id, created = new_call("cmpl")
    head = {
        "id": call_id,
        "object": "text_completion",
        "created": created,
        "model": ctx.model_id,
        "system_fingerprint": ctx.system_fingerprint,
    }
    echoes = [text if req.echo else "" for text, _ in prompts for _ in range(n)]
    gen = Generation(ctx.engine, call_id, jobs)
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        events = _stream(ctx, gen, head, echoes, logprobs_k, n, include_usage)
        return Stream(guarded(events), media_type="text/event-stream", headers=SSE_HEADERS)
    results = await collect_or_abort(request, gen, len(jobs))
    if results is None:
        return Response(b"", status_code=499)
    choices = []
    for i, r in enumerate(results):
        reason = finish_reason(r.finish_reason, r.error)
        lp = (
            completion_logprobs(ctx.token_texts, r.logprobs, logprobs_k, len(echoes[i]))
            if logprobs_k is not None
            else None
        )
        choices.append({"index": i, "text": echoes[i] + r.text, "logprobs": lp, "finish_reason": reason})
    return Response(head | {"choices": choices, "usage": usage_of(results, n)}, media_type="application/json")


async def _stream(
    ctx: ServerContext,
    gen: Generation,
    head: dict[str, Any],
    echoes: list[str],
    logprobs_k: int | None,
    n: int,
    include_usage: bool,
) -> AsyncIterator[bytes]:
    tail = {"usage": None} if include_usage else {}
    offsets = [len(e) for e in echoes]
    prompt_tokens: dict[int, tuple[int, int]] = {}  # prompt index -> (prompt tokens, cached tokens)
    completion = [0] * len(echoes)

    def chunk(index: int, text: str, reason: str | None, logprobs: Any = None) -> bytes:
        return event(
            head
            | {"choices": [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason}]}
            | tail
        )

    try:
        if any(echoes):
            yield b"".join(chunk(i, e, None) for i, e in enumerate(echoes) if e)
        async for batch in gen.batches(KEEPALIVE_S):
            if not batch:
                yield KEEPALIVE
                continue
            parts = []
            for index, out in batch:
                reason = finish_reason(out.finish_reason, out.error) if out.finished else None
                logprobs = None
                if logprobs_k is not None and out.logprobs:
                    logprobs = completion_logprobs(ctx.token_texts, out.logprobs, logprobs_k, offsets[index])
                    offsets[index] = logprobs["text_offset"][-1] + len(logprobs["tokens"][-1])
                if out.text_delta or logprobs is not None:
                    parts.append(chunk(index, out.text_delta, None, logprobs))
                if reason is not None:
                    parts.append(chunk(index, "", reason))
                completion[index] = out.num_output_tokens
                if index % n == 0:
                    prompt_tokens[index // n] = (out.num_prompt_tokens, out.num_cached_tokens)
            yield b"".join(parts)
        if include_usage:
            total = usage(
                sum(p for p, _ in prompt_tokens.values()),
                sum(completion),
                sum(c for _, c in prompt_tokens.values()),
            )
            yield event(head | {"choices": [], "usage": total})
    finally:
        gen.close()
