"""From request fields to engine requests, and back: sampling parameters (request > CLI/env defaults
> the model's generation_config), and `Generation`, which runs the n engine requests of one API call
and reads their outputs as one stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from localchat import sampling_defaults
from localchat.engine.async_engine import LoopSink, Sink
from localchat.engine.outputs import RequestOutput
from localchat.engine.request import FinishReason, ImageInput
from localchat.engine.sampling_params import SamplingParams
from localchat.errors import ContextLengthExceededError, InvalidRequestError
from localchat.serving.structured_input import parse_logit_bias

if TYPE_CHECKING:
    from localchat.engine.async_engine import AsyncEngine
    from localchat.engine.constraint import Constraint
    from localchat.serving.context import ServerContext
    from localchat.serving.schemas import SamplingFields

MAX_N = 16
_REQUEST_KEYS = sampling_defaults.REQUEST_KEYS


def normalize_stop(stop: str | list[str] | dict[str, Any] | None) -> list[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, dict):
        if set(stop) == {"Single"} and isinstance(stop["Single"], str):
            return [stop["Single"]]
        if set(stop) == {"Multiple"} and isinstance(stop["Multiple"], list):
            return list(stop["Multiple"])
        raise InvalidRequestError(
            '\'stop\' must be a string, a list of strings, or {"Single": "..."}.', param="stop"
        )
    return stop


def resolve_max_tokens(ctx: ServerContext, requested: int | None, param: str = "max_tokens") -> int:
    """The request's limit, or --max-gen-tokens; limits above --max-gen-tokens are clamped to it."""
    cap = ctx.settings.max_gen_tokens
    if requested is None:
        return cap
    if requested < 1:
        raise InvalidRequestError(f"'{param}' must be >= 1, got {requested}.", param=param)
    limit = ctx.engine.max_model_len
    if requested > limit:
        raise InvalidRequestError(
            f"'{param}' is {requested}, more than this model's context length of {limit} tokens.", param=param
        )
    return min(requested, cap)


def check_prompt_length(ctx: ServerContext, num_tokens: int, param: str = "messages") -> None:
    if num_tokens >= ctx.engine.max_model_len:
        err = ContextLengthExceededError(num_tokens, ctx.engine.max_model_len)
        err.param = param
        raise err


def check_n(n: int | None) -> int:
    n = 1 if n is None else n
    if not 1 <= n <= MAX_N:
        raise InvalidRequestError(f"'n' must be between 1 and {MAX_N}, got {n}.", param="n")
    return n


def resolve_sampling(ctx: ServerContext, requested: Mapping[str, Any]) -> dict[str, Any]:
    """The sampling fields of one request, for the API, the web UI and the terminal chat alike (see
    localchat/sampling_defaults.py): the request's own value > the server's flag > the model's
    recommendation > the built-in defaults. None in `requested` means "not set"."""
    values = sampling_defaults.resolve(
        requested, ctx.settings.sampling_defaults, ctx.model.generation_defaults
    )
    values["loop_stop"] = ctx.settings.loop_stop
    return values


def resolve_chat_max_tokens(ctx: ServerContext, requested: int | None) -> int:
    """An answer's limit in the web UI and the terminal chat: the conversation's own setting, else
    --chat-max-tokens (shorter than the API's --max-gen-tokens: a person is waiting and reading)."""
    if requested is not None:
        return resolve_max_tokens(ctx, requested)
    return min(ctx.settings.chat_max_tokens, ctx.settings.max_gen_tokens, ctx.engine.max_model_len)


def build_params(
    ctx: ServerContext,
    req: SamplingFields,
    *,
    max_tokens: int,
    logprobs: int | None,
    n: int,
    constraint: Constraint | None = None,
) -> list[SamplingParams]:
    """One SamplingParams per choice. With a seed s, choice i samples with seed s + i. The choices share
    `constraint` (a compiled grammar); the engine gives each its own matcher."""
    values = resolve_sampling(ctx, {k: getattr(req, k) for k in _REQUEST_KEYS})
    stop_ids = list(req.stop_token_ids or [])
    values.update(
        max_tokens=max_tokens,
        stop=normalize_stop(req.stop),
        stop_token_ids=stop_ids,
        logprobs=logprobs,
        ignore_eos=bool(req.ignore_eos),
        # harmony's channel and call markers are special tokens: its reader needs them
        skip_special_tokens=req.skip_special_tokens is not False and not ctx.tool_parser.keeps_special_tokens,
        include_stop_str_in_output=bool(req.include_stop_str_in_output),
        logit_bias=parse_logit_bias(ctx, req.logit_bias),
        constraint=constraint,
    )
    params = []
    for i in range(n):
        seed = None if req.seed is None else req.seed + i
        params.append(SamplingParams(**values, seed=seed))  # validates: out-of-range values raise 400
    return params


@dataclass(slots=True)
class ChoiceResult:
    """Everything one choice produced, gathered from its outputs."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[Any] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    num_output_tokens: int = 0
    error: str | None = None
    embedding: list[float] | None = None

    def add(self, out: RequestOutput) -> None:
        self.text += out.text_delta
        self.token_ids += out.new_token_ids
        self.logprobs += out.logprobs
        self.num_prompt_tokens = out.num_prompt_tokens
        self.num_cached_tokens = out.num_cached_tokens
        self.num_output_tokens = out.num_output_tokens
        if out.finished:
            self.finish_reason, self.error, self.embedding = out.finish_reason, out.error, out.embedding
            self.stop_reason = out.stop_reason


class Generation:
    """The engine requests of one API call (n choices, maybe several prompts), read as one stream of
    (choice index, output) batches. Closing it early aborts what is still running, which frees the
    requests' KV blocks at the engine's next step."""

    def __init__(
        self,
        engine: AsyncEngine,
        call_id: str,
        jobs: list[tuple[list[int], SamplingParams]],
        images: tuple[ImageInput, ...] = (),  # the pictures of the prompt (every job shares it)
    ) -> None:
        self._engine = engine
        self._loop = asyncio.get_running_loop()
        # Outputs not yet read, and the reader's future while it waits for one (see `batches`).
        self._ready: list[tuple[int, RequestOutput]] = []
        self._waiter: asyncio.Future[None] | None = None
        # One keep-alive timer at a time, moved on rather than made and cancelled per wait: it ends the
        # wait it finds past `_deadline` and otherwise sets itself again for the current wait's deadline.
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._open: dict[int, str] = {}
        try:
            for i, (prompt_ids, params) in enumerate(jobs):
                req_id = f"{call_id}-{i}"
                if images:
                    engine.submit(prompt_ids, params, self._sink(i), req_id, images=images)
                else:
                    engine.submit(prompt_ids, params, self._sink(i), req_id)
                # Safe after submit: outputs reach the queue through this (the loop's) thread.
                self._open[i] = req_id
        except BaseException:
            self.close()
            raise

    def _sink(self, index: int) -> Sink:
        return LoopSink(self._loop, self._put, (index,))

    def _put(self, index: int, output: RequestOutput) -> None:
        self._ready.append((index, output))
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    @property
    def finished(self) -> bool:
        return not self._open

    async def batches(
        self, keepalive_s: float | None = None
    ) -> AsyncIterator[list[tuple[int, RequestOutput]]]:
        """Yield every output ready now, together; an empty list when `keepalive_s` passed in silence.

        It waits on a bare future that `_put` completes: `asyncio.wait_for(queue.get(), ...)` cost a task,
        a waiter and a loop pass per decode token on the HTTP thread, whose CPU the decode's other core
        shares (#34)."""
        while self._open:
            if not self._ready and not await self._wait(keepalive_s):
                yield []
                continue
            batch, self._ready = self._ready, []
            for index, output in batch:
                if output.finished:
                    self._open.pop(index, None)
            yield batch

    async def _wait(self, timeout_s: float | None) -> bool:
        """Until `_put` brings an output (True) or `timeout_s` passes without one (False)."""
        waiter = self._waiter = self._loop.create_future()
        if timeout_s is not None:
            self._deadline = self._loop.time() + timeout_s
            if self._timer is None or self._timer.when() > self._deadline:  # (a shorter timeout than before)
                if self._timer is not None:
                    self._timer.cancel()
                self._timer = self._loop.call_at(self._deadline, self._keepalive_due)
        try:
            await waiter
        finally:
            self._waiter = None
        return bool(self._ready)

    def _keepalive_due(self) -> None:
        self._timer = None
        waiter = self._waiter
        if waiter is None or waiter.done():
            return  # no wait now: the next one sets a timer
        if self._loop.time() >= self._deadline:
            waiter.set_result(None)
        else:
            self._timer = self._loop.call_at(self._deadline, self._keepalive_due)

    async def collect(self, num_choices: int) -> list[ChoiceResult]:
        results = [ChoiceResult() for _ in range(num_choices)]
        async for batch in self.batches():
            for index, output in batch:
                results[index].add(output)
        return results

    def close(self) -> None:
        for req_id in self._open.values():
            self._engine.abort(req_id)
        self._open.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
