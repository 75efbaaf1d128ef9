"""A fake Hugging Face hub on 127.0.0.1: the endpoints and headers huggingface_hub and localchat use,
a second origin for LFS bytes (as the real hub's file host), Range support, gated repos, fault
injection and a request log.

    hub = FakeHub().start()
    hub.add_repo("org/model-GGUF", {"model-Q4_K_M.gguf": data, "config.json": b"{}"})
    hub.faults["model-Q4_K_M.gguf"] = Fault(drop_after=1000)   # drop the first response at byte 1000
    os.environ["HF_ENDPOINT"] = hub.url
    ...
    hub.log   # [Request(origin="hub"|"cdn", method, path, range_start, authorized), ...]
    hub.stop()

Hub origin: GET /api/models/{repo}[/revision/{rev}] (siblings with size, blobId, lfs.sha256), GET
/api/models/{repo}/tree/{rev}, GET /api/models?search=TEXT (the repos whose id contains it, most
downloaded first, with tags and cardData.license), HEAD/GET /{repo}/resolve/{rev}/{path}: LFS files answer 302 to the file
host with X-Repo-Commit, X-Linked-Etag, X-Linked-Size; small files answer 200 with a git-sha1 ETag.
Errors carry X-Error-Code (RepoNotFound, RevisionNotFound, EntryNotFound, GatedRepo) like the hub; a
token other than TOKEN gets 401 "Invalid credentials in Authorization header".
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

TOKEN = "hf_fake_token_for_tests"
LFS_SUFFIXES = (".gguf", ".safetensors", ".bin")
CHUNK = 1 << 20


@dataclass
class Fault:
    """Misbehaviour of the file host for one file."""

    drop_after: int | None = None  # close the connection after this many body bytes of a response
    times: int = 1  # how many responses `drop_after` hits
    stall_s: float = 0.0  # with drop_after: go silent this long before dropping (a stalled connection)
    corrupt_at: int | None = None  # flip the byte at this file offset (every response)
    throttle_bps: int | None = None  # send at most this many bytes a second
    status: int | None = None  # answer this status instead (e.g. 503), `times` times


@dataclass
class HubFile:
    path: str
    source: bytes | Path
    size: int
    sha256: str
    git_sha1: str

    @property
    def lfs(self) -> bool:
        return self.path.endswith(LFS_SUFFIXES) or self.size > 10_000

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.git_sha1

    def read(self, start: int, end: int) -> bytes:
        if isinstance(self.source, bytes):
            return self.source[start:end]
        with open(self.source, "rb") as f:
            f.seek(start)
            return f.read(end - start)


@dataclass
class FakeRepo:
    repo_id: str
    commit: str
    files: dict[str, HubFile]
    gated: bool = False
    license: str = "apache-2.0"  # in the API's tags and cardData, as the hub reports it
    downloads: int = 0


@dataclass
class Request:
    origin: str  # "hub" | "cdn"
    method: str
    path: str
    range_start: int | None
    authorized: bool  # carried an Authorization header (of any value)


@dataclass
class FakeHub:
    repos: dict[str, FakeRepo] = field(default_factory=dict)
    faults: dict[str, Fault] = field(default_factory=dict)  # by file path in its repo
    log: list[Request] = field(default_factory=list)
    max_parallel: int = 0  # the most file-host responses that were streaming at the same time
    _streaming: int = 0
    _count_lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> FakeHub:
        self._hub = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self, "hub"))
        self._cdn = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self, "cdn"))
        for server in (self._hub, self._cdn):
            server.daemon_threads = True
            threading.Thread(target=server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        for server in (self._hub, self._cdn):
            server.shutdown()
            server.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._hub.server_address[1]}"

    @property
    def cdn_url(self) -> str:
        return f"http://127.0.0.1:{self._cdn.server_address[1]}"

    def add_repo(self, repo_id: str, files: dict[str, bytes | Path], *, gated: bool = False) -> FakeRepo:
        commit = hashlib.sha1(repo_id.encode() + str(len(self.repos)).encode()).hexdigest()
        repo = FakeRepo(repo_id, commit, {p: _hub_file(p, src) for p, src in files.items()}, gated)
        self.repos[repo_id] = repo
        return repo

    def requests(self, origin: str | None = None, path_contains: str = "") -> list[Request]:
        return [r for r in self.log if (origin is None or r.origin == origin) and path_contains in r.path]

    def file_by_sha(self, sha256: str) -> HubFile | None:
        return next((f for r in self.repos.values() for f in r.files.values() if f.sha256 == sha256), None)


def _hub_file(path: str, source: bytes | Path) -> HubFile:
    sha256, sha1 = hashlib.sha256(), hashlib.sha1()  # git's blob id
    size = len(source) if isinstance(source, bytes) else source.stat().st_size
    sha1.update(f"blob {size}\0".encode())
    if isinstance(source, bytes):
        sha256.update(source)
        sha1.update(source)
    else:
        with open(source, "rb") as f:
            while chunk := f.read(CHUNK):
                sha256.update(chunk)
                sha1.update(chunk)
    return HubFile(path, source, size, sha256.hexdigest(), sha1.hexdigest())


_API = re.compile(r"^/api/models/([^/]+/[^/]+?)(?:/revision/([^/]+))?/?$")
_LIST = "/api/models"
_TREE = re.compile(r"^/api/models/([^/]+/[^/]+)/tree/([^/]+)/?$")
_RESOLVE = re.compile(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")
_RANGE = re.compile(r"bytes=(\d+)-(\d*)")


def _handler(hub: FakeHub, origin: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def do_HEAD(self) -> None:
            self._route(body=False)

        def do_GET(self) -> None:
            self._route(body=True)

        def _route(self, body: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            m = _RANGE.match(self.headers.get("Range", ""))
            hub.log.append(Request(origin, self.command, path, int(m.group(1)) if m else None,
                                   "authorization" in {k.lower() for k in self.headers}))  # fmt: skip
            try:
                auth = self.headers.get("Authorization")
                if origin == "hub" and auth is not None and auth != f"Bearer {TOKEN}":
                    self._error(401, "", message="Invalid credentials in Authorization header")
                elif origin == "cdn":
                    self._serve_lfs(path, body)
                elif path.rstrip("/") == _LIST:
                    self._list(parse_qs(urlsplit(self.path).query))
                elif api := _API.match(path):
                    self._model_info(api.group(1), api.group(2))
                elif tree := _TREE.match(path):
                    self._tree(tree.group(1), tree.group(2))
                elif res := _RESOLVE.match(path):
                    self._resolve(res.group(1), res.group(2), res.group(3), body)
                else:
                    self._error(404, "RepoNotFound")
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

        def _repo(self, repo_id: str, revision: str | None) -> FakeRepo | None:
            # Repo ids are case-insensitive on the hub; the API answers with the canonical spelling.
            repo = next((r for key, r in hub.repos.items() if key.lower() == repo_id.lower()), None)
            if repo is None:
                self._error(404, "RepoNotFound")
                return None
            if revision not in (None, "main", repo.commit):
                self._error(404, "RevisionNotFound")
                return None
            return repo

        def _list(self, query: dict[str, list[str]]) -> None:
            text = (query.get("search") or [""])[0].lower()
            limit = int((query.get("limit") or ["50"])[0])
            found = sorted(
                (r for r in hub.repos.values() if text in r.repo_id.lower()), key=lambda r: -r.downloads
            )
            self._json([{"id": r.repo_id, "modelId": r.repo_id, "downloads": r.downloads, "likes": 0,
                         "tags": ["gguf", f"license:{r.license}"], "cardData": {"license": r.license}}
                        for r in found[:limit]])  # fmt: skip

        def _model_info(self, repo_id: str, revision: str | None) -> None:
            if (repo := self._repo(repo_id, revision)) is None:
                return
            siblings = []
            for f in repo.files.values():
                entry: dict[str, Any] = {"rfilename": f.path, "size": f.size, "blobId": f.git_sha1}
                if f.lfs:
                    entry["lfs"] = {"sha256": f.sha256, "size": f.size, "pointerSize": 134}
                siblings.append(entry)
            self._json({"id": repo.repo_id, "sha": repo.commit, "siblings": siblings,
                        "gated": "manual" if repo.gated else False, "private": False,
                        "tags": ["gguf", f"license:{repo.license}"], "cardData": {"license": repo.license}})  # fmt: skip

        def _tree(self, repo_id: str, revision: str) -> None:
            if (repo := self._repo(repo_id, revision)) is None:
                return
            entries = []
            for f in repo.files.values():
                entry: dict[str, Any] = {"type": "file", "path": f.path, "size": f.size, "oid": f.git_sha1}
                if f.lfs:
                    entry["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": 134}
                entries.append(entry)
            self._json(entries)

        def _resolve(self, repo_id: str, revision: str, path: str, body: bool) -> None:
            if (repo := self._repo(repo_id, revision)) is None:
                return
            if repo.gated and self.headers.get("Authorization") != f"Bearer {TOKEN}":
                self._error(401 if "Authorization" not in self.headers else 403, "GatedRepo")
                return
            f = repo.files.get(path)
            if f is None:
                self._error(404, "EntryNotFound")
                return
            self.send_response(302 if f.lfs else 200)
            self.send_header("X-Repo-Commit", repo.commit)
            self.send_header("ETag", f'"{f.etag}"')
            if f.lfs:
                self.send_header("X-Linked-Etag", f'"{f.sha256}"')
                self.send_header("X-Linked-Size", str(f.size))
                self.send_header("Location", f"{hub.cdn_url}/lfs/{f.sha256}?repo={repo_id}&file={path}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_header("Content-Length", str(f.size))
            self.end_headers()
            if body:
                self.wfile.write(f.read(0, f.size))

        def _serve_lfs(self, path: str, body: bool) -> None:
            f = hub.file_by_sha(path.rsplit("/", 1)[-1])
            if f is None:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            fault = hub.faults.get(f.path, Fault())
            if fault.status and fault.times > 0 and body:
                fault.times -= 1
                self.send_response(fault.status)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            m = _RANGE.match(self.headers.get("Range", ""))
            start = int(m.group(1)) if m else 0
            end = int(m.group(2)) + 1 if m and m.group(2) else f.size
            if start >= f.size and f.size:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{f.size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206 if m else 200)
            if m:
                self.send_header("Content-Range", f"bytes {start}-{end - 1}/{f.size}")
            self.send_header("Content-Length", str(end - start))
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
            if body:
                with hub._count_lock:
                    hub._streaming += 1
                    hub.max_parallel = max(hub.max_parallel, hub._streaming)
                try:
                    self._send_body(f, start, end, fault)
                finally:
                    with hub._count_lock:
                        hub._streaming -= 1

        def _send_body(self, f: HubFile, start: int, end: int, fault: Fault) -> None:
            drop_at = None
            if fault.drop_after is not None and fault.times > 0:
                fault.times -= 1
                drop_at = start + fault.drop_after
            step = min(CHUNK, max(1, (fault.throttle_bps or CHUNK * 64) // 20))
            pos = start
            while pos < end:
                stop = min(end, pos + step, drop_at if drop_at is not None and drop_at > pos else end)
                data = bytearray(f.read(pos, stop))
                if fault.corrupt_at is not None and pos <= fault.corrupt_at < stop:
                    data[fault.corrupt_at - pos] ^= 0xFF
                self.wfile.write(data)
                pos = stop
                if drop_at is not None and pos >= drop_at:
                    self.wfile.flush()
                    time.sleep(fault.stall_s)
                    self.close_connection = True
                    self.connection.shutdown(2)  # the client sees a short body
                    return
                if fault.throttle_bps:
                    time.sleep(len(data) / fault.throttle_bps)

        def _json(self, payload: Any) -> None:
            data = json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command == "GET":
                self.wfile.write(data)

        def _error(self, status: int, code: str, message: str = "") -> None:
            data = json.dumps({"error": message or code}).encode()
            self.send_response(status)
            if code:
                self.send_header("X-Error-Code", code)
            if message:
                self.send_header("X-Error-Message", message)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command == "GET":
                self.wfile.write(data)

    return Handler


if (
    __name__ == "__main__"
):  # python -m tests.helpers.fake_hub [--throttle BPS] ORG/REPO FILE...: serve until killed
    import sys

    args = sys.argv[1:]
    throttle = int(args[1]) if args[0] == "--throttle" else None
    args = args[2:] if throttle else args
    served = FakeHub().start()
    served.add_repo(args[0], {Path(f).name: Path(f) for f in args[1:]})
    served.faults.update({Path(f).name: Fault(throttle_bps=throttle) for f in args[1:] if throttle})
    print(served.url, flush=True)
    threading.Event().wait()
