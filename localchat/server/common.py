"""Helpers the OpenAI routes share: the context, model and state checks, finish reasons, usage,
and waiting for a non-streamed result while watching for the client to leave."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import TYPE_CHECKING, Any

from localchat.engine.loop_guard import LOOP_STOP_REASON
from localchat.engine.request import FinishReason
from localchat.errors import ShuttingDownError
from localchat.server.errors import GenerationFailedError

if TYPE_CHECKING:
    from litestar import Request

    from localchat.models.manager import ModelManager
    from localchat.serving.context import ServerContext
    from localchat.serving.generation import ChoiceResult, Generation


def get_models(request: Request[Any, Any, Any]) -> ModelManager:
    return request.app.state.models


async def model_context(request: Request[Any, Any, Any], name: str | None) -> ServerContext:
    """The context for a request's `model`: loaded if needed (the request waits), 404 if unknown,
    503 with progress while the start-up model is getting ready or the server is shutting down."""
    ctx = await get_models(request).context_for(name)
    check_accepting(ctx)
    return ctx


def check_accepting(ctx: ServerContext) -> None:
    if ctx.draining:
        raise ShuttingDownError("The server is shutting down and takes no new requests.")


def new_call(prefix: str) -> tuple[str, int]:
    return f"{prefix}-{uuid.uuid4().hex}", int(time.time())


def loop_stop_field(stop_reason: str | int | None) -> dict[str, str]:
    """The extension field that tells an answer cut short by the loop guard (finish_reason "length")
    from one that reached max_tokens: {"stop_reason": "repetition"}, else nothing."""
    return {"stop_reason": LOOP_STOP_REASON} if stop_reason == LOOP_STOP_REASON else {}


def finish_reason(reason: FinishReason | None, error: str | None) -> str:
    """The OpenAI finish_reason; errors and aborts are not finish reasons: they raise."""
    if reason == FinishReason.STOP:
        return "stop"
    if reason == FinishReason.LENGTH:
        return "length"
    if reason == FinishReason.ABORT:
        raise GenerationFailedError(
            error or "The request was stopped before it finished (server shutting down)."
        )
    raise GenerationFailedError(error or "The request failed.")


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def usage_of(results: list[ChoiceResult], n: int) -> dict[str, Any]:
    """Each prompt is counted once (its first choice), however many choices shared it."""
    firsts = results[::n]
    return usage(
        sum(r.num_prompt_tokens for r in firsts),
        sum(r.num_output_tokens for r in results),
        sum(r.num_cached_tokens for r in firsts),
    )


async def _disconnected(request: Request[Any, Any, Any]) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def collect_or_abort(
    request: Request[Any, Any, Any], gen: Generation, num_choices: int
) -> list[ChoiceResult] | None:
    """Wait for every choice. A client that leaves first aborts the generation (freeing its blocks):
    then None, as nobody is left to answer."""
    collect = asyncio.ensure_future(gen.collect(num_choices))
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({collect, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not collect.done():
            collect.cancel()
            gen.close()
    return collect.result() if collect.done() and not collect.cancelled() else None
