"""The model catalog (`models.yaml`: packaged, extended by the data dir's) and `ResolvedModel`, what a
model flag becomes (`models.resolve`). Knows nothing of the hub, which reads the catalog."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from localchat.errors import ModelLoadError

DEFAULT_ALIAS = "smollm2-135m"
USER_CATALOG = "models.yaml"  # in the data dir; its entries extend (or override) the packaged ones


@dataclass(frozen=True, slots=True)
class CatalogEntry:
    alias: str
    description: str
    repo_id: str
    file: str | None
    format: str
    sha256: str | None
    size: int | None
    context_length: int | None
    license: str | None
    sources: tuple[dict[str, str], ...] = ()
    revision: str | None = None  # a pinned commit; None: the repo's default branch
    quant: str | None = None  # picked from the repo's GGUF files when `file` is not given
    parts: tuple[str, ...] = ()  # the files of a split GGUF, in order (informational)
    gated: bool = False  # the hub asks users to accept a licence first (HF_TOKEN needed)
    architecture: str | None = None  # Hugging Face model_type
    ram_gb: float | None = None  # rough memory needed to run it with a default context
    size_gb: float | None = None  # approximate download size, for listings when `size` is unknown
    tool_call: str | None = None  # tool-call format: hermes | llama3_json | mistral
    reasoning: bool = False  # writes <think>...</think> before answering
    draft: str | None = None  # the alias of a smaller model with its vocabulary (--speculative draft)
    eagle: str | None = None  # an EAGLE-3 head for this model: a repo or alias (--speculative eagle)
    type: str = "chat"  # chat | embedding | rerank (embedding/rerank: --embedding-model, --rerank-model)

    @classmethod
    def from_dict(cls, alias: str, d: dict[str, Any]) -> CatalogEntry:
        if not isinstance(d, dict) or "repo_id" not in d:
            raise ModelLoadError(f"models.yaml entry {alias!r} needs at least a repo_id.")
        return cls(
            alias=alias,
            description=str(d.get("description", "")),
            repo_id=str(d["repo_id"]),
            file=d.get("file"),
            format=str(
                d.get("format", "gguf" if str(d.get("file", "")).endswith(".gguf") else "safetensors")
            ),
            sha256=d.get("sha256"),
            size=d.get("size"),
            context_length=d.get("context_length"),
            license=d.get("license"),
            sources=tuple(d.get("sources") or ()),
            revision=d.get("revision"),
            quant=d.get("quant"),
            parts=tuple(d.get("parts") or ()),
            gated=bool(d.get("gated", False)),
            architecture=d.get("architecture"),
            ram_gb=d.get("ram_gb"),
            size_gb=d.get("size_gb", round(d["size"] / 1e9, 2) if d.get("size") else None),
            tool_call=d.get("tool_call"),
            reasoning=bool(d.get("reasoning", False)),
            draft=d.get("draft"),
            eagle=d.get("eagle"),
            type=str(d.get("type", "chat")),
        )


@lru_cache(maxsize=16)  # a pull reads the catalog several times; entries are frozen, so sharing is safe
def _parse(text: str, origin: str) -> dict[str, CatalogEntry]:
    try:
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}
    except yaml.YAMLError as exc:
        raise ModelLoadError(f"{origin} is not valid YAML: {exc}") from exc
    models = data.get("models") if isinstance(data, dict) else None
    if not isinstance(models, dict):
        raise ModelLoadError(f"{origin} must hold a top-level `models:` mapping of alias -> entry.")
    return {str(alias): CatalogEntry.from_dict(str(alias), entry) for alias, entry in models.items()}


def load_catalog(data_dir: Path | None = None) -> dict[str, CatalogEntry]:
    """The packaged catalog, extended by `<data dir>/models.yaml` when that file exists."""
    packaged = resources.files("localchat").joinpath("models.yaml").read_text(encoding="utf-8")
    catalog = dict(_parse(packaged, "the packaged models.yaml"))
    if data_dir is not None and (user := data_dir / USER_CATALOG).is_file():
        catalog.update(_parse(user.read_text(encoding="utf-8"), str(user)))
    return catalog


@dataclass(slots=True)
class ResolvedModel:
    path: Path
    model_id: str  # what /v1/models shows and clients pass as `model`
    aliases: list[str] = field(default_factory=list)  # other names clients may use for it
