"""POST /v1/embeddings: each input runs through the engine as a prefill-only request that answers the
mean-pooled, L2-normalised final hidden state (llama.cpp's pooling for decoder models), batched with
whatever else is running."""

from __future__ import annotations

import base64
from typing import Any

import msgspec
import numpy as np
from litestar import Request, Response, post

from localchat.engine.request import FinishReason
from localchat.engine.sampling_params import SamplingParams
from localchat.errors import InvalidRequestError
from localchat.server.common import collect_or_abort, model_context, new_call
from localchat.server.context import ServerContext
from localchat.server.generation import Generation, check_prompt_length
from localchat.server.schemas import decode_request

MAX_INPUTS = 256
_ENCODINGS = ("float", "base64")


class EmbeddingRequest(msgspec.Struct, kw_only=True):
    input: str | list[Any]
    model: str | None = None
    encoding_format: str | None = None
    dimensions: int | None = None
    user: str | None = None


def _inputs(ctx: ServerContext, value: str | list[Any]) -> list[list[int]]:
    """Token ids per input: a string, a list of strings, token ids, or a list of token-id lists."""
    tokenizer = ctx.model.tokenizer
    if isinstance(value, str) or (
        value and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    ):
        items: list[Any] = [value]
    else:
        items = value
    if not items:
        raise InvalidRequestError("'input' is empty.", param="input")
    if len(items) > MAX_INPUTS:
        raise InvalidRequestError(f"At most {MAX_INPUTS} inputs per request.", param="input")
    vocab = ctx.model.config.vocab_size
    out = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            ids = tokenizer.encode(item)
        elif isinstance(item, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in item):
            if any(not 0 <= t < vocab for t in item):
                raise InvalidRequestError(
                    f"'input[{i}]' holds token ids outside the vocabulary.", param="input"
                )
            ids = list(item)
        else:
            raise InvalidRequestError(
                "'input' must be a string, a list of strings, a list of token ids or a list of such lists.",
                param="input",
            )
        if not ids:
            raise InvalidRequestError(f"'input[{i}]' is empty.", param="input")
        check_prompt_length(ctx, len(ids), "input")
        out.append(ids)
    return out


def _encode(vector: list[float], encoding: str) -> list[float] | str:
    if encoding == "base64":  # little-endian float32, as OpenAI sends it
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()
    return vector


@post(["/v1/embeddings", "/embeddings"], name="openai:embeddings", status_code=200)
async def embeddings(request: Request[Any, Any, Any]) -> Response[Any]:
    req = decode_request(await request.body(), EmbeddingRequest)
    ctx = await model_context(request, req.model)
    encoding = req.encoding_format or "float"
    if encoding not in _ENCODINGS:
        raise InvalidRequestError("'encoding_format' must be float or base64.", param="encoding_format")
    if req.dimensions is not None:
        raise InvalidRequestError(
            "'dimensions' is not supported: this model's embeddings have a fixed size "
            f"({ctx.model.config.hidden_size}); leave it out.",
            param="dimensions",
        )
    inputs = _inputs(ctx, req.input)
    params = SamplingParams(max_tokens=1, temperature=0.0, embedding=True)
    call_id, _ = new_call("embd")
    gen = Generation(ctx.engine, call_id, [(ids, params) for ids in inputs])
    results = await collect_or_abort(request, gen, len(inputs))
    if results is None:
        return Response(b"", status_code=499)
    data = []
    for i, r in enumerate(results):
        if r.finish_reason != FinishReason.STOP or r.embedding is None:
            raise InvalidRequestError(f"Embedding input {i} failed: {r.error or r.finish_reason}.")
        data.append({"object": "embedding", "index": i, "embedding": _encode(r.embedding, encoding)})
    tokens = sum(len(ids) for ids in inputs)
    body = {
        "object": "list",
        "data": data,
        "model": ctx.model_id,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    return Response(body, media_type="application/json")
