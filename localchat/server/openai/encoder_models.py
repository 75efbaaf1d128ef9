"""The embedding and rerank models loaded beside the chat models (`--embedding-model`,
`--rerank-model`): loaded once at startup, kept in the app state, picked by a request's `model`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from litestar import Request

from localchat.errors import InvalidRequestError

if TYPE_CHECKING:
    from localchat.embeddings.model import EmbeddingModel


def encoder_models(request: Request[Any, Any, Any]) -> list[EmbeddingModel]:
    found = request.app.state.get("encoders")
    return list(found) if found else []


def pick_encoder(request: Request[Any, Any, Any], name: str | None, kind: str) -> EmbeddingModel | None:
    """The side model of `kind` ("embedding" or "rerank") that `name` selects: the one of that kind when
    `name` is empty, the one named otherwise (of either kind: a mismatch is said by the model). None:
    no side model answers, so the chat model does (embeddings) or nothing does (rerank)."""
    models = encoder_models(request)
    if name:
        return next((m for m in models if m.knows_model(name)), None)
    return next((m for m in models if m.kind == kind), None)


def require_reranker(request: Request[Any, Any, Any], name: str | None) -> EmbeddingModel:
    model = pick_encoder(request, name, "rerank")
    if model is None:
        loaded = [m.model_id for m in encoder_models(request) if m.kind == "rerank"]
        which = f" (loaded: {', '.join(loaded)})" if loaded else ""
        raise InvalidRequestError(
            f"No rerank model {name + ' ' if name else ''}is loaded{which}: start localchat with "
            "--rerank-model NAME|PATH (a cross-encoder such as bge-reranker or ms-marco-MiniLM).",
            param="model",
        )
    return model
