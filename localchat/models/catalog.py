"""The model catalog (`models.yaml`) and how a model flag becomes a local path.

A model is named by `--f FILE` (GGUF), `--w DIR` (safetensors folder) or `--m NAME`, where NAME is a
catalog alias, a local path, or a Hugging Face repo (`ORG/REPO[:QUANT|:FILE]`). A catalog or hub model
that is not on disk yet is pulled first (localchat.hub: resumable, sha256-checked, into the HF cache).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from localchat.errors import ModelLoadError, ModelNotFoundError

if TYPE_CHECKING:
    from localchat.hub import LocalModel, PullProgress

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


def is_repo_name(name: str) -> bool:
    from localchat.hub.spec import is_repo_name as check

    return check(name)


def resolve_model(
    *,
    weights: str | None = None,
    file: str | None = None,
    model: str | None = None,
    data_dir: Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> ResolvedModel:
    """Turn the model flags into a local path. No flag: the packaged default. Pulls what is missing."""
    if file is not None:
        return _local_file(file, "--f/--file")
    if weights is not None:
        return _local_folder(weights, "--w/--weights")
    catalog = load_catalog(data_dir)
    name = model or DEFAULT_ALIAS
    if name in catalog:
        entry = catalog[name]
        found = _pull(name, data_dir, progress)
        return ResolvedModel(found.path, entry.alias, [entry.repo_id] + ([entry.file] if entry.file else []))
    local = Path(name).expanduser()
    if local.exists():
        return _local_file(name, "--m/--model") if local.is_file() else _local_folder(name, "--m/--model")
    check_model_name(name, catalog)
    found = _pull(name, data_dir, progress)
    aliases = [a for a in (name, found.repo_id or "", found.path.name) if a and a != found.name]
    return ResolvedModel(found.path, found.name, aliases)


def check_model_name(name: str, catalog: dict[str, CatalogEntry]) -> None:
    """Raise ModelNotFoundError (with the closest aliases) unless `name` is an alias, a path that exists
    or a Hugging Face repo name: a typo is named as one, not as a download that did not finish."""
    if name in catalog or Path(name).expanduser().exists() or is_repo_name(name):
        return
    close = difflib.get_close_matches(name, list(catalog), n=3, cutoff=0.5)
    hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    raise ModelNotFoundError(
        f"Unknown model {name!r}: not a models.yaml alias ({', '.join(sorted(catalog))}), a local path, "
        f"or a Hugging Face repo (ORG/REPO, ORG/REPO:QUANT or ORG/REPO:FILE.gguf).{hint}",
        param="model",
    )


def _local_file(file: str, flag: str) -> ResolvedModel:
    path = Path(file).expanduser()
    if path.is_dir():
        raise ModelNotFoundError(
            f"{flag} {file!r} is a folder; it takes a .gguf file (a safetensors model folder goes to --w).",
            param="file",
        )
    if not path.is_file():
        raise ModelNotFoundError(f"{flag} {file!r}: no such GGUF file.", param="file")
    return ResolvedModel(path, path.stem, [path.name])


def _local_folder(folder: str, flag: str) -> ResolvedModel:
    path = Path(folder).expanduser()
    if not (path / "config.json").is_file():
        what = (
            "a folder without a config.json (not a safetensors model folder)"
            if path.is_dir()
            else "no such folder"
        )
        raise ModelNotFoundError(f"{flag} {folder!r}: {what}.", param="weights" if "--w" in flag else "model")
    return ResolvedModel(path, path.name)


def _pull(name: str, data_dir: Path | None, progress: Callable[[str], None] | None) -> LocalModel:
    """The local copy of `name`, pulled (resumable, verified) when missing; text progress per phase."""
    from localchat.hub import pull

    last_message = ""

    def report(event: PullProgress) -> None:  # each new message once, not every byte count
        nonlocal last_message
        if progress is not None and event.message and event.message != last_message:
            last_message = event.message
            progress(event.message)

    return pull(name, progress=report, data_dir=data_dir)
