"""Stream one file into the cache: resumable, retried when stalled, hashed while written, verified.

The partial file has a stable name (`blobs/<etag>.incomplete`), so a pull that was interrupted by
Ctrl-C, SIGKILL or a reboot continues with a `Range` request from the bytes on disk; their sha256 is
re-computed first, then the hash continues over the new bytes. The file is renamed into place only
after its digest matches: a corrupted download never becomes visible, and is deleted.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urljoin, urlsplit

from localchat.errors import ChecksumMismatchError, DownloadCancelledError, DownloadError
from localchat.hub import env
from localchat.hub.progress import ProgressTracker
from localchat.hub.remote import translate
from localchat.hub.sink import Sink

CHUNK = 1 << 20
MAX_STALLS = 6  # consecutive failed attempts (no new byte) before giving up; any progress resets it
MAX_REDIRECTS = 5


class CancelFlag(Protocol):
    """A threading.Event, or anything else that says when to stop."""

    def is_set(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class Digest:
    """What the finished file must hash to: sha256, or (small files) the git blob sha1."""

    kind: str  # "sha256" | "git-sha1"
    hex: str

    def hasher(self, size: int) -> Any:
        if self.kind == "sha256":
            return hashlib.sha256()
        h = hashlib.sha1()  # git's own blob id, not a security boundary
        h.update(f"blob {size}\0".encode())
        return h


def download(
    url: str,
    partial: Path,
    final: Path,
    *,
    size: int,
    digest: Digest | None,
    tracker: ProgressTracker,
    cancel: CancelFlag | None = None,
    auth: dict[str, str] | None = None,
    repo_id: str = "",
    client: Any = None,
    label: str | None = None,
) -> None:
    """Fetch `url` into `final` via `partial`; `auth` headers go to the hub's origin only.

    `client` is an httpx2 client; default: huggingface_hub's session (proxies, HF settings).
    """
    partial.parent.mkdir(parents=True, exist_ok=True)
    offset = partial.stat().st_size if partial.exists() else 0
    if offset > size:  # not ours, or the file changed upstream
        partial.unlink()
        offset = 0
    label = label or tracker.file or final.name
    digest = digest or Digest("sha256", "")  # unknown: hashed for the record, not checked
    hasher = digest.hasher(size)
    if offset:
        tracker.set_phase("resuming", message=f"re-hashing the {offset} bytes of {label} already on disk")
        _hash_prefix(partial, offset, hasher, tracker)
    tracker.set_phase("downloading", message=f"resuming at byte {offset}" if offset else None)
    stalls = 0
    with open(partial, "ab") as out:
        sink = Sink(out, hasher, offset)
        try:
            while sink.offset < size:
                before, last_error = sink.offset, None
                try:
                    _fetch_from(url, sink, size, digest, tracker, cancel, auth, client)
                except (DownloadError, DownloadCancelledError):
                    raise
                except Exception as exc:  # hub errors are translated, network trouble retried
                    _raise_if_final(exc, repo_id)
                    last_error = exc
                finally:
                    sink.drain()
                stalls = 0 if sink.offset > before else stalls + 1
                if stalls >= MAX_STALLS:
                    raise DownloadError(
                        f"Downloading {label} keeps failing ({type(last_error).__name__}: {last_error}); "
                        f"{sink.offset} of {size} bytes are kept, run the same pull again to resume."
                    )
                if sink.offset < size and stalls:
                    time.sleep(min(0.25 * 2**stalls, 8.0))
        finally:
            sink.close()
    tracker.set_phase("verifying", message=f"checking the {digest.kind} of {label}")
    actual = sink.hasher.hexdigest()
    if digest.hex and actual != digest.hex:
        partial.unlink(missing_ok=True)
        raise ChecksumMismatchError(label, digest.hex, actual)
    os.replace(partial, final)


def _raise_if_final(exc: Exception, repo_id: str) -> None:
    """A 4xx from the hub (gone, gated, refused) is not worth retrying: raise it as our error."""
    from huggingface_hub.errors import HfHubHTTPError

    if isinstance(exc, HfHubHTTPError):
        raise translate(exc, repo_id) from exc


def _hash_prefix(partial: Path, length: int, hasher: Any, tracker: ProgressTracker) -> None:
    with open(partial, "rb") as src:
        remaining = length
        while remaining and (chunk := src.read(min(CHUNK, remaining))):
            hasher.update(chunk)
            remaining -= len(chunk)
            tracker.add(len(chunk), transferred=False)


def _fetch_from(
    url: str,
    sink: Sink,
    size: int,
    digest: Digest,
    tracker: ProgressTracker,
    cancel: CancelFlag | None,
    auth: dict[str, str] | None,
    client: Any,
) -> None:
    """One GET from `sink.offset`, appending to the sink. Raises on network trouble (the caller retries)."""
    import httpx2
    from huggingface_hub.utils import get_session, hf_raise_for_status

    session = client or get_session()
    timeout = httpx2.Timeout(env.read_timeout_s(), connect=env.read_timeout_s())
    hub_origin = _origin(url)
    for _ in range(MAX_REDIRECTS):
        headers = dict(auth or {}) if _origin(url) == hub_origin else {}  # never leak the token
        headers["Accept-Encoding"] = "identity"
        if sink.offset:
            headers["Range"] = f"bytes={sink.offset}-"
        with session.stream("GET", url, headers=headers, follow_redirects=False, timeout=timeout) as response:
            if response.has_redirect_location:
                url = urljoin(url, response.headers["Location"])
                continue
            if response.status_code >= 500 or response.status_code in (408, 429):
                return  # transient: the caller backs off and retries
            if response.status_code == 416 or (sink.offset and response.status_code == 200):
                tracker.add(-sink.offset, transferred=False)  # Range refused or ignored: from byte 0
                sink.restart(digest.hasher(size))
                if response.status_code == 416:
                    return
            if response.status_code >= 400:
                response.read()
                hf_raise_for_status(response)
            _stream_body(response, sink, size, tracker, cancel)
            return
    raise DownloadError(f"Too many redirects while downloading {url}.")


def _stream_body(
    response: Any, sink: Sink, size: int, tracker: ProgressTracker, cancel: CancelFlag | None
) -> None:
    received = sink.offset
    for chunk in response.iter_raw():  # as the network delivers: a drop loses no received byte
        if cancel is not None and cancel.is_set():
            sink.drain()
            raise DownloadCancelledError(
                f"Download cancelled; {sink.offset} bytes are kept and the next pull resumes from there."
            )
        received += len(chunk)
        if received > size:
            raise DownloadError(f"The server sent more than the {size} bytes the hub announced.")
        sink.put(chunk)
        tracker.add(len(chunk))


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower()
