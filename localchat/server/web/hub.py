"""The Models page's Hugging Face hub search: GET /ui/models/hub (repos matching a query) and
GET /ui/models/hub/card (one repo's licence and quantizations, each with a Download that goes through
the same pulls as the catalog's)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import anyio.to_thread
from litestar import Request, Response, get
from litestar.params import FromQuery
from markupsafe import Markup

from localchat.errors import InvalidRequestError
from localchat.hub.search import model_card, search_models
from localchat.server.web.models import key_of, pull_view
from localchat.server.web.render import environment, html, models_macro


def hub_macro(name: str, *args: Any) -> str:
    return str(getattr(environment().get_template("_hub.html").module, name)(*args))


@get("/ui/models/hub", name="web:hub-search")
async def hub_search(q: FromQuery[str] = "") -> Response[str]:
    query = q.strip()[:100]
    if not query:
        return html(hub_macro("hub_results", [], ""))
    found = await anyio.to_thread.run_sync(search_models, query)
    rows = [{**asdict(m), "key": key_of(m.repo_id)} for m in found]
    return html(hub_macro("hub_results", rows, query))


@get("/ui/models/hub/card", name="web:hub-card")
async def hub_card(request: Request, repo: FromQuery[str]) -> Response[str]:
    if "/" not in repo:
        raise InvalidRequestError("Name a hub repo as ORG/REPO.", param="repo")
    card = await anyio.to_thread.run_sync(model_card, repo.strip())
    view = asdict(card)
    for quant in view["quants"]:
        quant["key"] = key_of(f"{card.repo_id}:{quant['quant']}")
    pulls = {
        job.name: Markup(models_macro("pull_progress", pull_view(job)))
        for job in request.app.state.models.pulls.jobs()
    }
    return html(hub_macro("hub_card", view, pulls))


ROUTES = [hub_search, hub_card]
