"""The model management API, for the web UI and scripts (same API key and origin rules as every route):

GET    /api/models                      local + catalog models, loaded ones, pulls in progress
POST   /api/models/pull {"name"}        start (or join) a pull; SSE of PullProgress JSON until it ends
GET    /api/models/pull?name=N          watch a running pull (SSE)
POST   /api/models/pull/cancel {"name"} stop a pull; the partial file stays for a resume
POST   /api/models/load {"name"}        load a local model (waits; "wait": false answers 202 at once)
POST   /api/models/unload {"name"}      unload (its in-flight requests finish first)
DELETE /api/models/{name}               delete a local model's files (unloads it first)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import anyio.to_thread
import msgspec
from litestar import Request, Response, delete, get, post
from litestar.params import FromQuery
from litestar.response import Stream

from localchat import hub
from localchat.errors import InvalidRequestError, NotFoundError
from localchat.host_memory import mem_available
from localchat.models.info import catalog_models, local_models
from localchat.models.pulls import PullJob
from localchat.server.common import get_models
from localchat.server.sse import KEEPALIVE, KEEPALIVE_S, SSE_HEADERS, event
from localchat.serving.schemas import decode_request


class ModelName(msgspec.Struct):
    name: str
    wait: bool = True
    whole_repo: bool = False


async def _name(request: Request[Any, Any, Any]) -> ModelName:
    body = decode_request(await request.body(), ModelName)
    if not body.name.strip():
        raise InvalidRequestError('Give the model\'s name, e.g. {"name": "smollm2-135m"}.', param="name")
    body.name = body.name.strip()
    return body


@get("/api/models", name="models:list")
async def list_all(request: Request[Any, Any, Any], q: FromQuery[str] = "") -> dict[str, Any]:
    models = get_models(request)
    available = mem_available()
    if available is not None:  # the side models' mapped weights: free to the OS, not to a chat model
        available = max(0, available - sum(m.file_backed for m in models.side_models))

    def collect() -> dict[str, Any]:  # reads the disk (HF cache, catalog): off the event loop
        return {
            "loaded": [ctx.model_id for ctx in reversed(models.loaded)],
            "loading": [{"name": t.name, "progress": t.progress()} for t in models.loading()],
            "local": local_models(models),
            "catalog": catalog_models(models, available, q[:200]),
            "pulls": [job.progress for job in models.pulls.jobs()],
            "ram_available_bytes": available,
            "side_models": [m.as_json() for m in models.side_models],  # never evicted
        }

    return await anyio.to_thread.run_sync(collect)


async def _progress_events(job: PullJob) -> AsyncIterator[bytes]:
    """The pull's progress as SSE; leaving early (client gone) stops only the watching, not the pull."""
    updates = job.watch()
    try:
        while True:
            try:
                progress = await asyncio.wait_for(anext(updates), KEEPALIVE_S)
            except StopAsyncIteration:
                return
            except TimeoutError:
                yield KEEPALIVE
                continue
            yield event(progress)
    finally:
        await updates.aclose()


@post("/api/models/pull", name="models:pull", status_code=200)
async def pull(request: Request[Any, Any, Any]) -> Stream:
    body = await _name(request)
    job = get_models(request).pulls.start(body.name)
    return Stream(_progress_events(job), media_type="text/event-stream", headers=SSE_HEADERS)


@get("/api/models/pull", name="models:watch")
async def watch(request: Request[Any, Any, Any], name: FromQuery[str]) -> Stream:
    job = get_models(request).pulls.get(name)
    if job is None:
        raise NotFoundError(f"No download of {name!r} was started on this server.", param="name")
    return Stream(_progress_events(job), media_type="text/event-stream", headers=SSE_HEADERS)


@post("/api/models/pull/cancel", name="models:cancel", status_code=200)
async def cancel(request: Request[Any, Any, Any]) -> dict[str, Any]:
    body = await _name(request)
    return {"name": body.name, "cancelled": get_models(request).pulls.cancel(body.name)}


@post("/api/models/load", name="models:load", status_code=200)
async def load(request: Request[Any, Any, Any]) -> Response[Any]:
    body = await _name(request)
    models = get_models(request)
    models.check_accepting()
    task = models.load(body.name)
    if not body.wait:
        return Response({"name": body.name, "status": "loading"}, status_code=202)
    await anyio.to_thread.run_sync(task.done.wait)
    if task.error is not None:
        raise task.error
    assert task.ctx is not None
    return Response({"name": body.name, "model": task.ctx.model_id, "loaded": _loaded(request)})


@post("/api/models/unload", name="models:unload", status_code=200)
async def unload(request: Request[Any, Any, Any]) -> dict[str, Any]:
    body = await _name(request)
    done = await anyio.to_thread.run_sync(get_models(request).unload, body.name)
    return {"name": body.name, "unloaded": done, "loaded": _loaded(request)}


@delete("/api/models/{name:path}", name="models:delete", status_code=200)
async def remove(request: Request[Any, Any, Any], whole_repo: FromQuery[bool] = False) -> dict[str, Any]:
    name = str(request.path_params["name"]).lstrip("/")
    models = get_models(request)
    await anyio.to_thread.run_sync(models.unload, name)
    freed = await anyio.to_thread.run_sync(
        lambda: hub.remove(name, data_dir=models.data_dir, whole_repo=whole_repo)
    )
    return {"name": name, "deleted": True, "freed_bytes": freed}


def _loaded(request: Request[Any, Any, Any]) -> list[str]:
    return [ctx.model_id for ctx in reversed(get_models(request).loaded)]


MODEL_ROUTES = [list_all, pull, watch, cancel, load, unload, remove]
