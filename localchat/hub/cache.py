"""The Hugging Face cache layout, written the way huggingface_hub writes it so other tools see our files.

<cache>/models--ORG--REPO/blobs/<etag>                  the bytes (etag = LFS sha256 or git sha1)
<cache>/models--ORG--REPO/blobs/<etag>.incomplete       our partial download (stable name: resumable)
<cache>/models--ORG--REPO/snapshots/<commit>/<path>     relative symlink to ../../blobs/<etag>
<cache>/models--ORG--REPO/refs/<branch>                 the commit the branch pointed at
<cache>/.locks/models--ORG--REPO/<etag>.lock            held while a blob is written
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def repo_dir(cache: Path, repo_id: str) -> Path:
    return cache / ("models--" + repo_id.replace("/", "--"))


def repo_id_of(folder: Path) -> str | None:
    """`models--ORG--REPO` -> "ORG/REPO"."""
    if not folder.name.startswith("models--"):
        return None
    return folder.name[len("models--") :].replace("--", "/", 1)


def blob_path(cache: Path, repo_id: str, etag: str) -> Path:
    return repo_dir(cache, repo_id) / "blobs" / etag


def partial_path(cache: Path, repo_id: str, etag: str) -> Path:
    return repo_dir(cache, repo_id) / "blobs" / f"{etag}.incomplete"


def lock_path(cache: Path, repo_id: str, etag: str) -> Path:
    return cache / ".locks" / repo_dir(cache, repo_id).name / f"{etag}.lock"


def snapshot_dir(cache: Path, repo_id: str, commit: str) -> Path:
    return repo_dir(cache, repo_id) / "snapshots" / commit


def link_snapshot(cache: Path, repo_id: str, commit: str, path: str, etag: str) -> Path:
    """Point snapshots/<commit>/<path> at the blob (a relative symlink; a copy where links are impossible)."""
    target = snapshot_dir(cache, repo_id, commit) / path
    target.parent.mkdir(parents=True, exist_ok=True)
    blob = blob_path(cache, repo_id, etag)
    relative = os.path.relpath(blob, target.parent)
    if target.is_symlink() or target.exists():
        if target.is_symlink() and os.readlink(target) == relative:
            return target
        target.unlink()
    try:
        os.symlink(relative, target)
    except OSError:  # e.g. Windows without developer mode: huggingface_hub copies too
        shutil.copyfile(blob, target)
    return target


def write_ref(cache: Path, repo_id: str, revision: str | None, commit: str) -> None:
    """refs/<branch> = commit, as huggingface_hub does for branch names (never for commit hashes)."""
    if revision is not None and _COMMIT.match(revision):
        return
    ref = repo_dir(cache, repo_id) / "refs" / (revision or "main")
    ref.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(ref, commit.encode())


def read_ref(cache: Path, repo_id: str, revision: str | None) -> str | None:
    """The commit a branch (or commit hash) names locally, if that snapshot exists."""
    if revision is not None and _COMMIT.match(revision):
        commit: str | None = revision
    else:
        ref = repo_dir(cache, repo_id) / "refs" / (revision or "main")
        commit = ref.read_text().strip() if ref.is_file() else None
    if commit and snapshot_dir(cache, repo_id, commit).is_dir():
        return commit
    return None


def snapshots(cache: Path, repo_id: str) -> list[str]:
    """Commits with a snapshot folder, newest first."""
    folder = repo_dir(cache, repo_id) / "snapshots"
    if not folder.is_dir():
        return []
    return [p.name for p in sorted(folder.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True)]


def snapshot_files(cache: Path, repo_id: str, commit: str) -> dict[str, Path]:
    """repo path -> file in the snapshot, for entries whose blob exists."""
    root = snapshot_dir(cache, repo_id, commit)
    found: dict[str, Path] = {}
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            if path.exists():  # a dangling link (blob removed) does not count
                found[path.relative_to(root).as_posix()] = path
    return found


def repos(cache: Path) -> list[str]:
    if not cache.is_dir():
        return []
    return sorted(r for d in cache.iterdir() if d.is_dir() and (r := repo_id_of(d)))


def write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def free_bytes(directory: Path) -> int:
    """Free space where `directory` (or its nearest existing parent) lives. Tests replace this."""
    probe = directory
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free
