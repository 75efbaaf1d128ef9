"""The app factory: `create_app(settings, models)` builds the Litestar app serving the OpenAI API (with
and without the `/v1` prefix), the model management API, /health, /metrics, and the web UI when it is
on and installed. `models` is the `ModelManager`, or one already built `ServerContext` (tests, library)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio.to_thread
from litestar import Litestar
from litestar.config.cors import CORSConfig
from litestar.datastructures import State

from localchat import __version__
from localchat.models.manager import ModelManager
from localchat.server.auth import require_api_key
from localchat.server.errors import handle_exception
from localchat.server.model_routes import MODEL_ROUTES
from localchat.server.monitoring import health, metrics
from localchat.server.openai.chat import chat_completions
from localchat.server.openai.completions import completions
from localchat.server.openai.embeddings import embeddings
from localchat.server.openai.models import get_model, list_models
from localchat.server.openai.rerank import rerank
from localchat.server.openai.responses import responses
from localchat.server.openapi import openapi_config
from localchat.server.security import guard_app, json_post_paths
from localchat.server.web.router import close_web_state, create_web_router

if TYPE_CHECKING:
    from localchat.config import Settings
    from localchat.embeddings.model import EmbeddingModel
    from localchat.serving.context import ServerContext

log = logging.getLogger(__name__)

API_ROUTES = [
    chat_completions,
    completions,
    responses,
    embeddings,
    rerank,
    list_models,
    get_model,
    health,
    metrics,
    *MODEL_ROUTES,
]


def create_app(
    settings: Settings,
    models: ModelManager | ServerContext,
    encoders: list[EmbeddingModel] | None = None,
) -> Litestar:
    """`encoders`: the embedding and rerank models loaded beside the chat models."""
    manager = models if isinstance(models, ModelManager) else ModelManager.preloaded(settings, models)
    manager.count_side_models([(e.model_id, e.kind, e.path) for e in encoders or []])

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        # Engine threads live exactly as long as the app serves; models load in the background.
        manager.start()
        if manager.mcp is not None:
            await manager.mcp.start()  # servers that fail are reported, the app serves anyway
        try:
            yield
        finally:
            if manager.mcp is not None:
                await manager.mcp.close()
            await anyio.to_thread.run_sync(manager.shutdown, settings.shutdown_timeout)
            for encoder in encoders or []:
                if encoder.engine is not None:
                    await encoder.engine.aclose()
            close_web_state(app.state)
            log.info("engines stopped")

    handlers: list[Any] = list(API_ROUTES)
    if settings.ui:
        handlers.append(create_web_router(settings))
    cors = None
    if settings.cors_origins:
        cors = CORSConfig(
            allow_origins=list(settings.cors_origins),
            allow_methods=["GET", "POST", "DELETE", "OPTIONS"],
            allow_headers=["Authorization", "Content-Type", "X-Api-Key"],
        )
    app = Litestar(
        route_handlers=handlers,
        state=State({"models": manager, "settings": settings, "encoders": list(encoders or [])}),
        guards=[require_api_key],
        exception_handlers={Exception: handle_exception},
        cors_config=cors,
        lifespan=[lifespan],
        request_max_body_size=settings.max_body_bytes,
        openapi_config=openapi_config(__version__),
        logging_config=None,  # the CLI configures logging (--log)
        debug=False,
    )
    guard_app(app, settings, json_post_paths(API_ROUTES))
    return app
