"""POST /v1/rerank (also /rerank and /v2/rerank): a query and documents in, one relevance score per
document out, best first, in the shape Jina, Cohere, llama.cpp and vLLM share:
`{"results": [{"index", "relevance_score", "document": {"text"}}]}`. Scored by the cross-encoder of
--rerank-model, the (query, document) pairs batched into as few forward passes as fit."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, Response, post

from localchat.errors import InvalidRequestError
from localchat.server.common import new_call
from localchat.server.openai.encoder_models import require_reranker
from localchat.server.openapi import api_operation
from localchat.serving.schemas import decode_request

MAX_DOCUMENTS = 1024


class RerankRequest(msgspec.Struct, kw_only=True):
    query: str
    documents: list[Any]
    model: str | None = None
    top_n: int | None = None
    return_documents: bool = True


def _text(doc: Any, i: int) -> str:
    """A document is a string, or an object with `text` (Cohere v1, Jina)."""
    if isinstance(doc, str):
        return doc
    if isinstance(doc, dict) and isinstance(doc.get("text"), str):
        return str(doc["text"])
    raise InvalidRequestError(
        f"'documents[{i}]' must be a string or an object with 'text'.", param="documents"
    )


@post(
    ["/v1/rerank", "/rerank", "/v2/rerank"],
    name="rerank",
    status_code=200,
    operation_class=api_operation(RerankRequest),
)
async def rerank(request: Request[Any, Any, Any]) -> Response[Any]:
    req = decode_request(await request.body(), RerankRequest)
    model = require_reranker(request, req.model)
    if not req.documents:
        raise InvalidRequestError("'documents' is empty.", param="documents")
    if len(req.documents) > MAX_DOCUMENTS:
        raise InvalidRequestError(f"At most {MAX_DOCUMENTS} documents per request.", param="documents")
    if req.top_n is not None and req.top_n < 1:
        raise InvalidRequestError("'top_n' must be at least 1.", param="top_n")
    texts = [_text(d, i) for i, d in enumerate(req.documents)]
    scores, tokens = await model.rerank(req.query, texts)
    order = sorted(range(len(texts)), key=lambda i: -float(scores[i]))[: req.top_n or len(texts)]
    results = []
    for i in order:
        row: dict[str, Any] = {"index": i, "relevance_score": float(scores[i])}
        if req.return_documents:
            row["document"] = {"text": texts[i]}
        results.append(row)
    call_id, _ = new_call("rerank")
    body = {
        "id": call_id,
        "object": "list",
        "model": model.model_id,
        "results": results,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    return Response(body, media_type="application/json")
