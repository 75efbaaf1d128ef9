"""How a model flag becomes a local path.

A model is named by `--f FILE` (GGUF), `--w DIR` (safetensors folder) or `--m NAME`, where NAME is a
catalog alias, a local path, or a Hugging Face repo (`ORG/REPO[:QUANT|:FILE]`). A catalog or hub model
that is not on disk yet is pulled first (localchat.hub: resumable, sha256-checked, into the HF cache).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from pathlib import Path

from localchat.errors import ModelNotFoundError
from localchat.hub import LocalModel, PullProgress, pull
from localchat.hub.spec import is_repo_name
from localchat.models.catalog import DEFAULT_ALIAS, CatalogEntry, ResolvedModel, load_catalog


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
    last_message = ""

    def report(event: PullProgress) -> None:  # each new message once, not every byte count
        nonlocal last_message
        if progress is not None and event.message and event.message != last_message:
            last_message = event.message
            progress(event.message)

    return pull(name, progress=report, data_dir=data_dir)
