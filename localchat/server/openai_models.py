"""GET /v1/models and /v1/models/{id}: the loaded model, with its context length."""

from __future__ import annotations

from typing import Any

from litestar import Request, get

from localchat.server.common import check_model, get_ctx
from localchat.server.context import ServerContext
from localchat.server.openapi import api_operation


def _card(ctx: ServerContext) -> dict[str, Any]:
    return {
        "id": ctx.model_id,
        "object": "model",
        "created": ctx.created,
        "owned_by": "localchat",
        "max_model_len": ctx.engine.max_model_len,
    }


@get(["/v1/models", "/models"], name="openai:models", operation_class=api_operation())
async def list_models(request: Request[Any, Any, Any]) -> dict[str, Any]:
    return {"object": "list", "data": [_card(get_ctx(request))]}


@get(
    ["/v1/models/{model_id:path}", "/models/{model_id:path}"],
    name="openai:model",
    operation_class=api_operation(path_params={"model_id": "A model id or alias (may hold slashes)."}),
)
async def get_model(request: Request[Any, Any, Any]) -> dict[str, Any]:
    ctx = get_ctx(request)
    # Ids may hold slashes (HF repo ids), hence the `path` parameter, which keeps a leading "/".
    name = str(request.path_params["model_id"]).lstrip("/")
    check_model(ctx, name or None)
    return _card(ctx)
