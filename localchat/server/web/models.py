"""The web UI's models: the Models page (catalog with search, local models, downloads with live
progress, load / unload / delete), the header's model picker, and the model status partial that the
pages poll while a model downloads or loads (and that offers the default model on a first start)."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

import anyio.to_thread
from litestar import Request, Response, get, post
from litestar.params import FromQuery

from localchat import hub
from localchat.errors import InvalidRequestError
from localchat.host_memory import mem_available
from localchat.models.catalog import DEFAULT_ALIAS
from localchat.models.info import catalog_models, human_bytes, local_models, ram_hint
from localchat.models.manager import ModelManager
from localchat.models.pulls import FINAL_PHASES, PullJob
from localchat.server.web.common import require_htmx
from localchat.server.web.render import html, render
from localchat.server.web.render import models_macro as macro


def _models(request: Request) -> ModelManager:
    return request.app.state.models


def _available() -> int | None:
    return mem_available()


def key_of(name: str) -> str:
    """An HTML id for a model name (names hold slashes and colons)."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", name)


async def _form_name(request: Request) -> str:
    name = str((await request.form()).get("name", "")).strip()
    if not name:
        raise InvalidRequestError("Pick a model first.", param="name")
    return name


# -- the status partial (first start, loading, downloading) --------------------------------------------


def model_status(models: ModelManager, name: str | None = None, *, reload: bool = False) -> dict[str, Any]:
    """What the status partial shows: the model `name` (a switch in progress) or the server's state."""
    status: dict[str, Any]
    task = next((t for t in models.loading() if t.name == name), None) if name else None
    if name and task is None and (ctx := models.lookup(name)) is not None:
        status = {"status": "ok", "model": ctx.model_id}
    elif task is not None:
        status = {"status": task.phase, "model": task.name, "progress": task.progress()}
    else:
        _, status = models.health()
    progress = status.get("progress") or {}
    total = progress.get("total_bytes") or 0
    return {
        **status,
        "key": name or "",
        "reload": reload,
        "percent": int(100 * (progress.get("done_bytes") or 0) / total) if total else None,
        "bytes": _bytes_line(progress),
        "default": DEFAULT_ALIAS,
    }


def _bytes_line(progress: dict[str, Any]) -> str:
    if not progress.get("total_bytes"):
        # No size yet (the index has not answered): bytes so far if any, else what is happening.
        done = progress.get("done_bytes")
        return f"{human_bytes(done)} so far" if done else str(progress.get("message") or "")
    line = f"{human_bytes(progress.get('done_bytes'))} / {human_bytes(progress.get('total_bytes'))}"
    if progress.get("speed_bps"):
        line += f" · {human_bytes(progress['speed_bps'])}/s"
    if progress.get("eta_s") is not None and progress.get("phase") in ("downloading", "resuming"):
        line += f" · {int(progress['eta_s'])} s left"
    return line


def _status_response(models: ModelManager, name: str | None, reload: bool) -> Response[str]:
    status = model_status(models, name, reload=reload)
    # The page was drawn without a model: once one is ready, draw it again (picker, composer).
    headers = {"HX-Refresh": "true"} if reload and status["status"] == "ok" else {}
    return html(macro("model_status", status), headers=headers)


@get("/ui/model-status", name="web:model-status", sync_to_thread=False)
def status_partial(
    request: Request, name: FromQuery[str] = "", reload: FromQuery[bool] = False
) -> Response[str]:
    return _status_response(_models(request), name or None, reload)


@post("/ui/model", name="web:pick-model", guards=[require_htmx])
async def pick_model(request: Request) -> Response[str]:
    """The header's picker: load the chosen model (the next message of this chat goes to it)."""
    form = await request.form()
    name, conv_id = str(form.get("model", "")).strip(), str(form.get("conv", "")).strip()
    models = _models(request)
    if not name:
        raise InvalidRequestError("Pick a model first.", param="name")
    models.check_accepting()
    models.load(name)
    if conv_id:
        web = request.app.state.get("localchat_web")
        if web is not None and not web.chats.is_generating(conv_id):
            web.store.update_settings(conv_id, model=name)
    if form.get("open"):  # "Use in chat" on the Models page: the chat page, with the model picked
        return html("", headers={"HX-Redirect": "/?model=" + quote(name, safe="")})
    return _status_response(models, name, False)


@post("/ui/models/get-started", name="web:get-started", guards=[require_htmx])
async def get_started(request: Request) -> Response[str]:
    """First start: download the default model (or the one asked for) and load it."""
    models = _models(request)
    name = str((await request.form()).get("name", "")).strip() or DEFAULT_ALIAS
    models.check_accepting()
    models.fetch_and_load(name)
    return _status_response(models, None, True)


# -- the Models page -------------------------------------------------------------------------------------


@get("/ui/models", name="web:models")
async def models_page(request: Request) -> Response[str]:
    models = _models(request)
    available = _available()
    local, catalog = await anyio.to_thread.run_sync(
        lambda: (local_models(models), catalog_models(models, available))
    )
    pulls = {job.name: pull_view(job) for job in models.pulls.jobs()}
    return html(
        render(
            "models.html",
            status=model_status(models),
            local=local,
            catalog=_catalog_rows(catalog, available),
            pulls=pulls,
            ram=human_bytes(available) if available else None,
        )
    )


def _catalog_rows(catalog: list[dict[str, Any]], available: int | None) -> list[dict[str, Any]]:
    for info in catalog:
        info["key"] = key_of(str(info["alias"]))
        info["size_text"] = human_bytes(info["download_bytes"]) if info.get("download_bytes") else "?"
        info["ram_text"] = ram_hint(info, available)
    return catalog


@get("/ui/models/local", name="web:models-local")
async def local_partial(request: Request) -> Response[str]:
    models = _models(request)
    return html(macro("local_models", await anyio.to_thread.run_sync(local_models, models)))


@get("/ui/models/catalog", name="web:models-catalog")
async def catalog_partial(request: Request, q: FromQuery[str] = "") -> Response[str]:
    models, available = _models(request), _available()
    rows = await anyio.to_thread.run_sync(lambda: catalog_models(models, available, q[:200]))
    pulls = {job.name: pull_view(job) for job in models.pulls.jobs()}
    return html(macro("catalog_rows", _catalog_rows(rows, available), pulls))


def pull_view(job: PullJob) -> dict[str, Any]:
    progress = dict(job.progress)
    total = progress.get("total_bytes") or 0
    return {
        **progress,
        "name": job.name,
        "key": key_of(job.name),
        "percent": int(100 * (progress.get("done_bytes") or 0) / total) if total else None,
        "line": _bytes_line(progress),
        "final": progress.get("phase") in FINAL_PHASES,
    }


def _pull_response(job: PullJob) -> Response[str]:
    view = pull_view(job)
    # A finished download changes the local list: the page reloads that part.
    headers = {"HX-Trigger": "models-changed"} if view["phase"] == "done" else {}
    return html(macro("pull_progress", view), headers=headers)


@post("/ui/models/pull", name="web:pull", guards=[require_htmx])
async def pull(request: Request) -> Response[str]:
    return _pull_response(_models(request).pulls.start(await _form_name(request)))


@get("/ui/models/pull", name="web:pull-progress", sync_to_thread=False)
def pull_progress(request: Request, name: FromQuery[str]) -> Response[str]:
    job = _models(request).pulls.get(name)
    if job is None:
        raise InvalidRequestError(f"No download of {name!r} is running.", param="name")
    return _pull_response(job)


@post("/ui/models/pull/cancel", name="web:pull-cancel", guards=[require_htmx])
async def cancel(request: Request) -> Response[str]:
    models, name = _models(request), await _form_name(request)
    models.pulls.cancel(name)
    job = models.pulls.get(name)
    if job is None:
        raise InvalidRequestError(f"No download of {name!r} is running.", param="name")
    await anyio.to_thread.run_sync(job.done.wait, 10.0)  # the pull stops at its next chunk
    return _pull_response(job)


@post("/ui/models/load", name="web:load", guards=[require_htmx])
async def load(request: Request) -> Response[str]:
    models, name = _models(request), await _form_name(request)
    models.check_accepting()
    models.load(name)
    return _status_response(models, name, False)


@post("/ui/models/unload", name="web:unload", guards=[require_htmx])
async def unload(request: Request) -> Response[str]:
    models, name = _models(request), await _form_name(request)
    await anyio.to_thread.run_sync(models.unload, name)
    return html(macro("local_models", await anyio.to_thread.run_sync(local_models, models)))


@post("/ui/models/delete", name="web:delete-model", guards=[require_htmx])
async def delete_model(request: Request) -> Response[str]:
    models, name = _models(request), await _form_name(request)
    await anyio.to_thread.run_sync(models.unload, name)
    await anyio.to_thread.run_sync(lambda: hub.remove(name, data_dir=models.data_dir))
    return html(macro("local_models", await anyio.to_thread.run_sync(local_models, models)))


ROUTES = [
    status_partial,
    pick_model,
    get_started,
    models_page,
    local_partial,
    catalog_partial,
    pull,
    pull_progress,
    cancel,
    load,
    unload,
    delete_model,
]
