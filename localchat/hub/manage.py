"""`remove` and `verify`: what `localchat rm` and `localchat verify` do."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from localchat.errors import ModelNotFoundError, ModelNotOwnedError
from localchat.hub import cache, env, ledger
from localchat.hub.download import CHUNK, Digest
from localchat.hub.local import find_local, list_local
from localchat.hub.records import LocalModel
from localchat.models.catalog import load_catalog

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_SHA1 = re.compile(r"^[0-9a-f]{40}$")


def _shared(link: Path, shared: set[str]) -> bool:
    return any(link.as_posix().endswith("/" + path) for path in shared)


def remove(name: str, *, data_dir: Path | None = None, whole_repo: bool = False, force: bool = False) -> int:
    """Delete one local model (or, `whole_repo`, every file of its repo); returns the bytes freed.

    Files localchat did not download (found in the shared HF cache) are kept unless `force`.
    """
    from localchat.paths import data_dir as default_data_dir

    data_dir = data_dir or default_data_dir()
    model = _local_or_partial(name, data_dir)
    if model.source == "pypi":
        freed = sum(p.stat().st_size for p in model.files)
        for p in model.files:
            p.unlink()
        return freed
    assert model.repo_id is not None
    hub_cache = env.hub_cache_dir()
    records = ledger.load(data_dir)
    owned = ledger.owned_etags(records, model.repo_id)
    # a file another local model of the repo also lists (their shared mmproj) stays
    shared = {
        f.path
        for m in records.values()
        if m.repo_id == model.repo_id and m.name != model.name
        for f in m.files
    }
    links = (
        _repo_links(hub_cache, model.repo_id)
        if whole_repo
        else [p for p in model.files if p.is_symlink() and not _shared(p, shared)]
    )
    foreign = sorted({p.name for p in links if _etag(p) not in owned})
    if foreign and not force:
        raise ModelNotOwnedError(
            f"localchat did not download {', '.join(foreign)} (another tool put it in the Hugging Face cache "
            f"{hub_cache}); it was left alone. Pass --force to delete it anyway."
        )
    etags = {_etag(p) for p in links} | {
        f.etag for m in records.values() if m.name == model.name for f in m.files
    }
    for link in links:
        link.unlink()
    freed = _delete_unreferenced_blobs(hub_cache, model.repo_id, etags)
    if whole_repo:
        shutil.rmtree(cache.repo_dir(hub_cache, model.repo_id), ignore_errors=True)
    else:
        _prune_empty_dirs(cache.repo_dir(hub_cache, model.repo_id) / "snapshots")

    def forget(models: dict[str, ledger.LedgerModel]) -> None:
        for key in [
            k
            for k, m in models.items()
            if m.name == model.name or (whole_repo and m.repo_id == model.repo_id)
        ]:
            del models[key]

    ledger.update(data_dir, forget)
    return freed


def verify(name: str, *, data_dir: Path | None = None) -> tuple[bool, str]:
    """Re-hash every file of a local model against its sha256 (catalog pin, LFS etag) or git blob id."""
    from localchat.paths import data_dir as default_data_dir

    data_dir = data_dir or default_data_dir()
    model = find_local(name, data_dir=data_dir)
    if model is None:
        return False, f"{name} is not on this machine (or only partly downloaded): `localchat pull {name}`."
    pins = _catalog_pins(name, data_dir)
    problems, checked = [], 0
    for path in model.files:
        digest = _expected(path, pins)
        if digest is None:
            continue
        actual = _hash(path, digest)
        checked += 1
        if actual != digest.hex:
            problems.append(f"{path.name}: {digest.kind} {actual}, expected {digest.hex}")
    if problems:
        return False, f"{model.name} is corrupted ({'; '.join(problems)}); `localchat rm` it and pull again."
    if not checked:
        return False, f"{model.name}: no checksum is known for its files, nothing could be checked."
    return True, f"{model.name}: {checked} file(s), {model.size_bytes} bytes, checksums match."


def _local_or_partial(name: str, data_dir: Path) -> LocalModel:
    model = find_local(name, data_dir=data_dir)
    if model is None:
        model = next((m for m in list_local(data_dir=data_dir) if m.name.lower() == name.lower()), None)
    if model is None:
        raise ModelNotFoundError(
            f"{name} is not on this machine; `localchat list` shows what is.", param="model"
        )
    return model


def _repo_links(hub_cache: Path, repo_id: str) -> list[Path]:
    root = cache.repo_dir(hub_cache, repo_id) / "snapshots"
    return [Path(d) / n for d, _dirs, names in os.walk(root) for n in names]


def _etag(link: Path) -> str:
    return Path(os.readlink(link)).name if link.is_symlink() else link.name


def _delete_unreferenced_blobs(hub_cache: Path, repo_id: str, etags: set[str]) -> int:
    still_used = {_etag(p) for p in _repo_links(hub_cache, repo_id)}
    freed = 0
    for etag in etags - still_used:
        for path in (cache.blob_path(hub_cache, repo_id, etag), cache.partial_path(hub_cache, repo_id, etag)):
            if path.exists():
                freed += path.stat().st_size
                path.unlink()
    return freed


def _prune_empty_dirs(root: Path) -> None:
    for dirpath, _dirs, _names in sorted(os.walk(root), key=lambda t: len(t[0]), reverse=True):
        if dirpath != str(root) and not os.listdir(dirpath):
            os.rmdir(dirpath)


def _catalog_pins(name: str, data_dir: Path) -> dict[str, str]:
    entry = load_catalog(data_dir).get(name)
    return {entry.file.rsplit("/", 1)[-1]: entry.sha256} if entry and entry.file and entry.sha256 else {}


def _expected(path: Path, pins: dict[str, str]) -> Digest | None:
    if path.name in pins:
        return Digest("sha256", pins[path.name])
    etag = _etag(path)
    if _SHA256.match(etag):
        return Digest("sha256", etag)
    if _SHA1.match(etag):
        return Digest("git-sha1", etag)
    return None


def _hash(path: Path, digest: Digest) -> str:
    hasher = digest.hasher(path.stat().st_size)
    with open(path, "rb") as src:
        while chunk := src.read(CHUNK):
            hasher.update(chunk)
    return str(hasher.hexdigest())
