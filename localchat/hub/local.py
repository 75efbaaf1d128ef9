"""Models on this machine: found in the HF cache (ours or other tools'), in the data dir (PyPI), or
half-downloaded. Nothing here touches the network."""

from __future__ import annotations

import re
from pathlib import Path

from localchat.errors import LocalchatError
from localchat.hub import cache, env, ledger
from localchat.hub.files import (
    Selection,
    gguf_groups,
    gguf_selection,
    is_chat_gguf,
    pick,
    quant_of,
    repo_format,
    split_total,
)
from localchat.hub.records import LocalModel
from localchat.hub.spec import ModelSpec, canonical_name, parse, spec_for_entry
from localchat.models.catalog import CatalogEntry, load_catalog

_SHARD = re.compile(r"-\d{5}-of-(\d{5})\.safetensors$")


def find_local(name: str, *, data_dir: Path | None = None) -> LocalModel | None:
    """The complete local copy of `name`, or None. Never touches the network."""
    data_dir = _data_dir(data_dir)
    try:
        spec = parse(name, data_dir)
    except LocalchatError:
        return None
    if spec.entry is not None and (wheel_copy := _pypi_copy(spec.entry, data_dir)) is not None:
        return wheel_copy
    hub_cache = env.hub_cache_dir()
    commits = _candidate_commits(hub_cache, spec)
    owned = ledger.owned_etags(ledger.load(data_dir), spec.repo_id)
    for commit in commits:
        files = cache.snapshot_files(hub_cache, spec.repo_id, commit)
        try:
            selection = pick(spec.repo_id, {p: f.stat().st_size for p, f in files.items()},
                             quant=spec.quant, file=spec.file)  # fmt: skip
        except LocalchatError:
            continue
        if not _complete(selection, files):
            continue
        model_name = (
            spec.entry.alias
            if spec.entry
            else canonical_name(spec.repo_id, selection.format, selection.quant, selection.main_path)
        )
        chosen = {p: files[p] for p in selection.paths}
        source = "localchat" if _blob_etag(chosen[selection.main_path]) in owned else "hf-cache"
        return model_from_snapshot(model_name, spec.repo_id, commit, selection, chosen, source=source)
    return None


def model_from_snapshot(
    name: str, repo_id: str, commit: str, selection: Selection, files: dict[str, Path], *, source: str
) -> LocalModel:
    paths = [files[p] for p in selection.paths]
    main = paths[0].parent if selection.format == "safetensors" else paths[0]
    return LocalModel(
        name=name, repo_id=repo_id, quant=selection.quant, format=selection.format, path=main, files=paths,
        size_bytes=sum(p.stat().st_size for p in paths), complete=True, partial_bytes=0, source=source,
        revision=commit,
    )  # fmt: skip


def list_local(*, data_dir: Path | None = None) -> list[LocalModel]:
    """Every model on disk: PyPI-fetched files, HF cache snapshots, and partial downloads."""
    data_dir = _data_dir(data_dir)
    catalog = load_catalog(data_dir)
    found: dict[str, LocalModel] = {}
    for entry in catalog.values():
        if (copy := _pypi_copy(entry, data_dir)) is not None:
            found[copy.name] = copy
    hub_cache = env.hub_cache_dir()
    records = ledger.load(data_dir)
    aliases = _aliases_by_file(catalog)
    for repo_id in cache.repos(hub_cache):
        owned = ledger.owned_etags(records, repo_id)
        for commit in reversed(cache.snapshots(hub_cache, repo_id)):  # newest last: it wins
            for model in _snapshot_models(hub_cache, repo_id, commit, owned):
                key = model.files[0].name if (repo_id, model.files[0].name) in aliases else model.quant
                model.name = aliases.get((repo_id, key or ""), model.name)
                found[model.name] = model
    for record in records.values():
        if not record.complete and record.name not in found:
            found[record.name] = _partial_model(record)
    return sorted(found.values(), key=lambda m: m.name.lower())


def _snapshot_models(hub_cache: Path, repo_id: str, commit: str, owned: set[str]) -> list[LocalModel]:
    files = cache.snapshot_files(hub_cache, repo_id, commit)
    sizes = {p: f.stat().st_size for p, f in files.items()}
    kind = repo_format(list(files))
    selections: list[Selection] = []
    if kind == "gguf":
        for parts in gguf_groups(sizes).values():
            selections.append(gguf_selection(sizes, parts))  # with its projector, as pulled
    elif kind == "safetensors":
        selections.append(pick(repo_id, sizes))
    models = []
    for selection in selections:
        chosen = {p: files[p] for p in selection.paths}
        source = "localchat" if _blob_etag(chosen[selection.main_path]) in owned else "hf-cache"
        name = canonical_name(repo_id, selection.format, selection.quant, selection.main_path)
        model = model_from_snapshot(name, repo_id, commit, selection, chosen, source=source)
        model.complete = _complete(selection, files)
        if not model.complete:  # e.g. another tool's split download that stopped halfway
            model.partial_bytes = model.size_bytes
        models.append(model)
    return models


def _partial_model(record: ledger.LedgerModel) -> LocalModel:
    hub_cache = Path(record.cache)
    on_disk = 0
    paths = []
    for f in record.files:
        blob, partial = (
            cache.blob_path(hub_cache, record.repo_id, f.etag),
            cache.partial_path(hub_cache, record.repo_id, f.etag),
        )
        on_disk += blob.stat().st_size if blob.exists() else partial.stat().st_size if partial.exists() else 0
        paths.append(cache.snapshot_dir(hub_cache, record.repo_id, record.commit) / f.path)
    return LocalModel(
        name=record.name, repo_id=record.repo_id, quant=record.quant, format=record.format, path=paths[0],
        files=paths, size_bytes=sum(f.size for f in record.files), complete=False, partial_bytes=on_disk,
        source="localchat", revision=record.commit,
    )  # fmt: skip


def _pypi_copy(entry: CatalogEntry, data_dir: Path) -> LocalModel | None:
    """The default model's file as fetched from its PyPI wheel into `<data dir>/models`."""
    if not entry.file or not any("pypi" in s for s in entry.sources):
        return None
    path = data_dir / "models" / entry.file
    if not path.is_file() or (entry.size is not None and path.stat().st_size != entry.size):
        return None
    return LocalModel(
        name=entry.alias, repo_id=entry.repo_id, quant=quant_of(entry.file), format=entry.format, path=path,
        files=[path], size_bytes=path.stat().st_size, complete=True, partial_bytes=0, source="pypi",
    )  # fmt: skip


def _candidate_commits(hub_cache: Path, spec: ModelSpec) -> list[str]:
    """The snapshot the revision names locally first, then (no pinned revision) every other one."""
    pinned = cache.read_ref(hub_cache, spec.repo_id, spec.revision)
    others = [] if spec.revision and pinned else cache.snapshots(hub_cache, spec.repo_id)
    return ([pinned] if pinned else []) + [c for c in others if c != pinned]


def _complete(selection: Selection, files: dict[str, Path]) -> bool:
    if not all(p in files for p in selection.paths):
        return False
    if selection.format == "gguf":
        return sum(is_chat_gguf(p) for p in selection.paths) == split_total(selection.paths[0])  # + mmproj
    shards = [p for p in selection.paths if p.endswith(".safetensors")]
    totals = {int(m.group(1)) for p in shards if (m := _SHARD.search(p))}
    # Sharded weights (model-00001-of-00004.safetensors): every shard must be there.
    return "config.json" in selection.paths and bool(shards) and all(len(shards) >= t for t in totals)


def _blob_etag(snapshot_file: Path) -> str:
    return snapshot_file.resolve().name


def _aliases_by_file(catalog: dict[str, CatalogEntry]) -> dict[tuple[str, str], str]:
    """(repo, file name) -> alias, so `list` shows catalog models by their alias."""
    out = {}
    for entry in catalog.values():
        spec = spec_for_entry(entry)
        if spec.file:
            out[(spec.repo_id, spec.file.rsplit("/", 1)[-1])] = entry.alias
        elif spec.quant:
            out[(spec.repo_id, spec.quant.upper())] = entry.alias
    return out


def _data_dir(data_dir: Path | None) -> Path:
    from localchat.paths import data_dir as default_data_dir

    return data_dir or default_data_dir()
