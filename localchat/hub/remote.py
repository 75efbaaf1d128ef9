"""What the hub says about a repo: its commit and files (size, sha256, etag), with typed errors.

One `GET /api/models/{repo}/revision/{rev}?blobs=True` answers everything: the commit, and per file
its size, git blob id and (LFS files) sha256, which is also the etag huggingface_hub names blobs by.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from localchat import __version__
from localchat.errors import (
    DownloadError,
    GatedRepoError,
    ModelNotFoundError,
    OfflineError,
    RepoNotFoundError,
)
from localchat.hub import env


@dataclass(frozen=True, slots=True)
class RemoteFile:
    path: str
    size: int
    etag: str  # the blob name in the cache: LFS sha256, else the git blob sha1
    sha256: str | None  # None for small (non-LFS) files


@dataclass(frozen=True, slots=True)
class RemoteRepo:
    repo_id: str
    commit: str
    files: dict[str, RemoteFile]
    gated: bool

    def sizes(self) -> dict[str, int]:
        return {path: f.size for path, f in self.files.items()}


def auth_headers() -> dict[str, str]:
    """User agent and (when a token is set) `Authorization`, for requests to the hub's origin only.

    NOTE: not huggingface_hub's build_hf_headers: that also fetches an "agent harness" registry from
    the endpoint it read at import time, a request we neither want nor can point anywhere.
    """
    from huggingface_hub import __version__ as hf_version

    headers = {"user-agent": f"localchat/{__version__}; hf_hub/{hf_version}"}
    if token := env.token():
        headers["authorization"] = f"Bearer {token}"
    return headers


def fetch_repo(repo_id: str, revision: str | None) -> RemoteRepo:
    """The repo's commit and file list, or a typed error a user can act on."""
    if env.offline():
        raise OfflineError(
            f"{repo_id} is not on this machine and HF_HUB_OFFLINE=1 forbids downloading it. Unset "
            "HF_HUB_OFFLINE to download, or use a model you already have (`localchat list`).",
            param="model",
        )
    rev = f"/revision/{quote(revision, safe='')}" if revision else ""
    url = f"{env.endpoint()}/api/models/{repo_id}{rev}"
    data = hub_json(url, repo_id, params={"blobs": "True"})
    files: dict[str, RemoteFile] = {}
    for sibling in data.get("siblings") or []:
        lfs = sibling.get("lfs") or {}
        sha256 = lfs.get("sha256") or lfs.get("oid")
        etag = sha256 or sibling.get("blobId") or ""
        size = lfs.get("size", sibling.get("size"))
        if etag and size is not None:
            path = str(sibling["rfilename"])
            files[path] = RemoteFile(path, int(size), str(etag), sha256)
    # The hub's own spelling of the id (case, renames), so the cache folder is the one others use.
    canonical = str(data.get("id") or repo_id)
    return RemoteRepo(
        canonical if "/" in canonical else repo_id, str(data["sha"]), files, bool(data.get("gated"))
    )


def hub_json(url: str, repo_id: str, params: dict[str, str] | None = None) -> Any:
    """GET a hub API URL through huggingface_hub's session; hub errors become localchat errors."""
    from huggingface_hub.utils import get_session, hf_raise_for_status

    try:
        response = get_session().get(url, headers=auth_headers(), params=params, timeout=env.read_timeout_s())
        hf_raise_for_status(response)
        return response.json()
    except Exception as exc:  # translated into one of our typed errors right here
        raise translate(exc, repo_id) from exc


def translate(exc: Exception, repo_id: str) -> Exception:
    """A huggingface_hub / HTTP exception as the localchat error to show."""
    import httpx2
    from huggingface_hub import errors as hf

    if isinstance(exc, DownloadError | ModelNotFoundError):
        return exc
    if isinstance(exc, hf.GatedRepoError):
        return GatedRepoError(repo_id, env.endpoint())
    if isinstance(exc, hf.RevisionNotFoundError):
        return ModelNotFoundError(f"{repo_id} has no revision by that name ({exc}).", param="model")
    if isinstance(exc, hf.RepositoryNotFoundError):
        hint = "" if env.token() else " If it is private, set HF_TOKEN to a token that can read it."
        return RepoNotFoundError(
            f"{repo_id} was not found on {env.endpoint()}: check the spelling (ORG/REPO).{hint}",
            param="model",
        )
    if isinstance(exc, hf.OfflineModeIsEnabled):
        return OfflineError(f"{repo_id}: HF_HUB_OFFLINE=1 forbids downloading; unset it to download.")
    if isinstance(exc, hf.HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else "?"
        if status == 401:
            return DownloadError(
                f"{env.endpoint()} refused the access token (401). Check HF_TOKEN, or unset it for public models."
            )
        return DownloadError(f"The hub answered {status} for {repo_id}: {str(exc).splitlines()[0]}")
    if isinstance(exc, httpx2.ProxyError):
        return OfflineError(
            f"The proxy refused the connection to {env.endpoint()} ({exc}); check HTTPS_PROXY."
        )
    if isinstance(exc, httpx2.TransportError):
        return OfflineError(
            f"Cannot reach {env.endpoint()} ({type(exc).__name__}: {exc}). Check your network (and HTTPS_PROXY "
            "if you use a proxy), set HF_ENDPOINT to a mirror of the hub, or use a model already on disk "
            "(`localchat list`; HF_HUB_OFFLINE=1 then makes no requests at all)."
        )
    return DownloadError(f"Talking to the hub about {repo_id} failed: {type(exc).__name__}: {exc}")
