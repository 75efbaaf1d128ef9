"""What a model NAME means: a catalog alias, `ORG/REPO`, `ORG/REPO:QUANT` or `ORG/REPO:FILE`."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from localchat.errors import ModelNotFoundError
from localchat.models.catalog import CatalogEntry, load_catalog

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")
_HUB_PREFIXES = ("hf.co/", "huggingface.co/", "https://huggingface.co/", "https://hf.co/")


@dataclass(slots=True)
class ModelSpec:
    """One way to get the model: a hub repo, and what to take from it."""

    name: str  # what the user asked for
    repo_id: str
    revision: str | None = None  # None: the default branch
    quant: str | None = None
    file: str | None = None
    sha256: dict[str, str] = field(default_factory=dict)  # repo path -> pinned sha256 (catalog)
    entry: CatalogEntry | None = None  # set for catalog aliases


def is_repo_name(name: str) -> bool:
    """`ORG/REPO` or `ORG/REPO:X` (and not a path that exists on disk)."""
    base = _strip_prefix(name).split(":", 1)[0]
    return bool(_REPO_ID.match(base)) and not Path(name).expanduser().exists()


def parse(name: str, data_dir: Path | None = None) -> ModelSpec:
    """The spec for `name`, or ModelNotFoundError saying which forms are understood."""
    catalog = load_catalog(data_dir)
    if name in catalog:
        return spec_for_entry(catalog[name])
    if not is_repo_name(name):
        raise ModelNotFoundError(
            f"Unknown model {name!r}: use a catalog alias ({', '.join(sorted(catalog))}), ORG/REPO, "
            "ORG/REPO:QUANT (e.g. Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M) or ORG/REPO:FILE.gguf.",
            param="model",
        )
    repo_id, _, tag = _strip_prefix(name).partition(":")
    if not tag:
        return ModelSpec(name, repo_id)
    if tag.lower().endswith((".gguf", ".safetensors")):
        return ModelSpec(name, repo_id, file=tag)
    return ModelSpec(name, repo_id, quant=tag.upper())


def spec_for_entry(entry: CatalogEntry) -> ModelSpec:
    """The hub source of a catalog entry (its `hf` source, else its repo_id)."""
    source = next((s for s in entry.sources if "hf" in s), None)
    repo_id = str(source["hf"]) if source else entry.repo_id
    file = (source or {}).get("file") or entry.file
    revision = (source or {}).get("revision") or entry.revision
    pins = {file: entry.sha256} if file and entry.sha256 else {}
    return ModelSpec(entry.alias, repo_id, revision, entry.quant, file, pins, entry)


def canonical_name(repo_id: str, fmt: str, quant: str | None, main_path: str) -> str:
    """How a hub model is listed: "ORG/REPO:QUANT", "ORG/REPO:FILE" (no quant tag), "ORG/REPO"."""
    if fmt == "safetensors":
        return repo_id
    return f"{repo_id}:{quant or main_path}"


def _strip_prefix(name: str) -> str:
    for prefix in _HUB_PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name
