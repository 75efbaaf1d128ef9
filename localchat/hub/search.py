"""Searching the Hugging Face hub beyond the catalog (the Models page): GGUF repos matching a query, and
one repo's card (licence, its GGUF files' quantizations and sizes), through huggingface_hub's HTTP
session against HF_ENDPOINT (a mirror, or a test's fake hub)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from localchat.hub import env
from localchat.hub.remote import hub_json

# The quantization a GGUF file name states (…-Q4_K_M.gguf, …-IQ3_XS.gguf, …-f16.gguf).
_QUANT = re.compile(r"(?i)(?<![A-Za-z0-9])(I?Q\d(?:_[A-Z0-9]+)*|TQ\d_\d|MXFP4|NVFP4|BF16|F16|F32)(?=[.-])")
MAX_RESULTS = 20


@dataclass(frozen=True, slots=True)
class HubModel:
    repo_id: str
    downloads: int = 0
    likes: int = 0
    license: str = ""


@dataclass(frozen=True, slots=True)
class HubQuant:
    quant: str  # e.g. "Q4_K_M"; the file name when it names none
    files: tuple[str, ...]  # a split model has several parts
    size_bytes: int


@dataclass(frozen=True, slots=True)
class HubCard:
    repo_id: str
    license: str
    gated: bool
    quants: list[HubQuant] = field(default_factory=list)


def _license(data: dict[str, Any]) -> str:
    card = data.get("cardData") or {}
    if isinstance(card, dict) and card.get("license"):
        return str(card["license"])
    tags = [str(t) for t in data.get("tags") or []]
    return next((t.removeprefix("license:") for t in tags if t.startswith("license:")), "")


def search_models(query: str, limit: int = MAX_RESULTS) -> list[HubModel]:
    """GGUF repos whose name matches `query`, most downloaded first."""
    params = {"search": query.strip(), "filter": "gguf", "sort": "downloads", "direction": "-1",
              "limit": str(limit), "full": "true"}  # fmt: skip
    found = hub_json(f"{env.endpoint()}/api/models", query, params=params)
    return [
        HubModel(str(m.get("id") or m.get("modelId")), int(m.get("downloads") or 0), int(m.get("likes") or 0),
                 _license(m))
        for m in found if isinstance(m, dict) and (m.get("id") or m.get("modelId"))
    ]  # fmt: skip


def quant_of(path: str) -> str:
    name = path.rsplit("/", 1)[-1]
    match = _QUANT.search(name)
    return match.group(1).upper() if match else name


def model_card(repo_id: str) -> HubCard:
    """The repo's licence and its GGUF files grouped by quantization (split parts summed)."""
    data = hub_json(
        f"{env.endpoint()}/api/models/{quote(repo_id, safe='/')}", repo_id, params={"blobs": "True"}
    )
    quants: dict[str, tuple[list[str], int]] = {}
    for sibling in data.get("siblings") or []:
        path = str(sibling.get("rfilename", ""))
        if not path.lower().endswith(".gguf"):
            continue
        size = int((sibling.get("lfs") or {}).get("size", sibling.get("size")) or 0)
        files, total = quants.get(quant_of(path), ([], 0))
        quants[quant_of(path)] = ([*files, path], total + size)
    ordered = sorted(quants.items(), key=lambda kv: kv[1][1])
    return HubCard(
        str(data.get("id") or repo_id), _license(data), bool(data.get("gated")),
        [HubQuant(q, tuple(files), size) for q, (files, size) in ordered],
    )  # fmt: skip
