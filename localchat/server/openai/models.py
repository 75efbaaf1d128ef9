"""GET /v1/models and /v1/models/{id}: the local models, the loaded ones marked (with context length),
then the embedding and rerank models loaded beside them (`type`: embedding or rerank). A chat model's card
says whether it takes images (`vision`), read from its config.json. A model still downloading or loading
(the start-up model from `--f`/`--w` included) is listed with its `status`, so a client that reads the list
once at connect (Open WebUI, Dify) sees it before it is ready."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio.to_thread
from litestar import Request, get

from localchat.errors import ModelNotFoundError
from localchat.server.common import get_models
from localchat.server.openai.encoder_models import encoder_models
from localchat.server.openapi import api_operation
from localchat.vision.model_info import takes_images

if TYPE_CHECKING:
    from localchat.models.manager import ModelManager


def _cards(models: ModelManager) -> list[dict[str, Any]]:
    cards = [
        {
            "id": ctx.model_id,
            "object": "model",
            "created": ctx.created,
            "owned_by": "localchat",
            "loaded": True,
            "max_model_len": ctx.engine.max_model_len,
            "vision": takes_images(ctx.model.path),
        }
        for ctx in reversed(models.loaded)  # the current model first
    ]
    seen = {card["id"] for card in cards}
    for task in models.loading():
        if task.name not in seen:
            seen.add(task.name)
            status = "downloading" if task.phase == "downloading" else "loading"
            cards.append({"id": task.name, "object": "model", "created": 0, "owned_by": "localchat"})
            cards[-1] |= {"loaded": False, "status": status}
    for local in models.local_models():
        if getattr(local, "complete", True) and str(local.name) not in seen:
            seen.add(str(local.name))
            cards.append({"id": str(local.name), "object": "model", "created": 0, "owned_by": "localchat"})
            cards[-1] |= {"loaded": False, "vision": takes_images(Path(local.path))}
    return cards


@get(["/v1/models", "/models"], name="openai:models", operation_class=api_operation())
async def list_models(request: Request[Any, Any, Any]) -> dict[str, Any]:
    # Listing the local store reads the disk (the HF cache): off the event loop.
    cards = await anyio.to_thread.run_sync(_cards, get_models(request))
    return {"object": "list", "data": cards + _encoder_cards(request)}


def _encoder_cards(request: Request[Any, Any, Any]) -> list[dict[str, Any]]:
    return [
        {
            "id": m.model_id,
            "object": "model",
            "created": 0,
            "owned_by": "localchat",
            "loaded": True,
            "type": m.kind,
            "max_model_len": m.tokenizer.max_length,
        }
        for m in encoder_models(request)
    ]


@get(
    ["/v1/models/{model_id:path}", "/models/{model_id:path}"],
    name="openai:model",
    operation_class=api_operation(path_params={"model_id": "A model id or alias (may hold slashes)."}),
)
async def get_model(request: Request[Any, Any, Any]) -> dict[str, Any]:
    models = get_models(request)
    # Ids may hold slashes (HF repo ids), hence the `path` parameter, which keeps a leading "/".
    name = str(request.path_params["model_id"]).lstrip("/")
    if (ctx := models.lookup(name or None)) is not None:
        name = ctx.model_id
    for card in await anyio.to_thread.run_sync(_cards, models) + _encoder_cards(request):
        if card["id"] == name:
            return card
    raise ModelNotFoundError(
        f"The model {name!r} does not exist on this server (see GET /v1/models).", param="model"
    )
