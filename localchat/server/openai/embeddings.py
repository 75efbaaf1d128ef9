"""POST /v1/embeddings. With an embedding model loaded (--embedding-model) and `model` naming it or left
out, its batching encoder answers (pooling, normalisation and prompts as its sentence-transformers
config says; `dimensions` truncates Matryoshka-style). Otherwise each input runs through the chat
model's engine as a prefill-only request that answers the mean-pooled, L2-normalised final hidden state
(llama.cpp's pooling for decoder models), batched with whatever else is running."""

from __future__ import annotations

import base64
from typing import Any

import msgspec
import numpy as np
from litestar import Request, Response, post

from localchat.embeddings import vectors
from localchat.embeddings.model import EmbeddingModel
from localchat.embeddings.text import Encoded
from localchat.engine.request import FinishReason
from localchat.engine.sampling_params import SamplingParams
from localchat.errors import InvalidRequestError
from localchat.server.common import collect_or_abort, model_context, new_call
from localchat.server.openai.encoder_models import pick_encoder
from localchat.server.openapi import api_operation
from localchat.serving.context import ServerContext
from localchat.serving.generation import Generation, check_prompt_length
from localchat.serving.schemas import decode_request

MAX_INPUTS = 256
MAX_SIDE_INPUTS = 2048  # a dedicated embedding model batches them into a few passes
_ENCODINGS = ("float", "base64")


class EmbeddingRequest(msgspec.Struct, kw_only=True):
    input: str | list[Any]
    model: str | None = None
    encoding_format: str | None = None
    dimensions: int | None = None
    user: str | None = None
    input_type: str | None = None  # extension: the embedding model's prompt name (query, document...)


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


@post(
    ["/v1/embeddings", "/embeddings"],
    name="openai:embeddings",
    status_code=200,
    operation_class=api_operation(EmbeddingRequest),
)
async def embeddings(request: Request[Any, Any, Any]) -> Response[Any]:
    req = decode_request(await request.body(), EmbeddingRequest)
    encoding = req.encoding_format or "float"
    if encoding not in _ENCODINGS:
        raise InvalidRequestError("'encoding_format' must be float or base64.", param="encoding_format")
    side = pick_encoder(request, req.model, "embedding")
    if side is not None:
        return await _side_model_embeddings(side, req, encoding)
    ctx = await model_context(request, req.model)
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


def _side_inputs(model: EmbeddingModel, value: str | list[Any], input_type: str | None) -> list[Encoded]:
    if isinstance(value, str) or (
        value and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    ):
        items: list[Any] = [value]
    else:
        items = value
    if not items:
        raise InvalidRequestError("'input' is empty.", param="input")
    if len(items) > MAX_SIDE_INPUTS:
        raise InvalidRequestError(f"At most {MAX_SIDE_INPUTS} inputs per request.", param="input")
    out = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            out.append(model.encode_text(item, input_type))
        elif (
            isinstance(item, list)
            and item
            and all(isinstance(t, int) and not isinstance(t, bool) for t in item)
        ):
            out.append(model.tokenizer.encode_ids(item))
        else:
            raise InvalidRequestError(
                f"'input[{i}]' must be a non-empty string or list of token ids.", param="input"
            )
    return out


async def _side_model_embeddings(
    model: EmbeddingModel, req: EmbeddingRequest, encoding: str
) -> Response[Any]:
    items = _side_inputs(model, req.input, req.input_type)
    size = model.encoder.dimension
    if req.dimensions is not None and not 1 <= req.dimensions <= size:
        vectors.truncate(np.zeros((0, size), np.float32), req.dimensions, size)  # raises the 400
    rows = vectors.truncate(await model.embed(items), req.dimensions, size)
    tokens = sum(len(i) for i in items)
    body = {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": vectors.encode(row, encoding)}
            for i, row in enumerate(rows)
        ],
        "model": model.model_id,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    return Response(body, media_type="application/json")
