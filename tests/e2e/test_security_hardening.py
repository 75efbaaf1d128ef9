"""Issue #27's attacks against a real `localchat serve`: a GET that would load a model (and evict the
user's), every GET route leaving the server as it was, slowloris sockets, a huge prompt that used to
freeze every route, the data dir's modes, a key in the access log, and the gate's path variants."""

from __future__ import annotations

import json
import os
import re
import socket
import sqlite3
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.fake_app import say
from tests.helpers.live_server import LiveServer, live_server, real_backend_missing, server_args
from tests.helpers.tiny_gguf import random_state_dict, tiny_config, write_tiny_gguf

HX = {"HX-Request": "true"}
TINY = "org/tiny-GGUF"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _wait_answers_done(client: httpx.Client, home: Path) -> None:
    deadline = time.monotonic() + 30
    while _rows(home, "SELECT count(*) FROM messages WHERE status = 'streaming'") != [(0,)]:
        assert time.monotonic() < deadline, "the answer never finished"
        time.sleep(0.05)


def _rows(home: Path, query: str) -> list[tuple[Any, ...]]:
    db = sqlite3.connect(f"file:{home / 'conversations.sqlite3'}?mode=ro", uri=True)
    try:
        return db.execute(query).fetchall()
    finally:
        db.close()


# -- a loose data dir, the access log, the gate's path variants (one fake-backend server) -----------------


@pytest.fixture(scope="module")
def loose_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data dir as an older version (or a copy) left it: readable by everyone."""
    home = tmp_path_factory.mktemp("loose") / "localchat"
    (home / "logs").mkdir(parents=True)
    sqlite3.connect(home / "conversations.sqlite3").close()
    (home / "logs" / "localchat.log").write_text("an old line\n")
    for path in (home, home / "logs"):
        path.chmod(0o755)
    for path in (home / "conversations.sqlite3", home / "logs" / "localchat.log"):
        path.chmod(0o644)
    return home


@pytest.fixture(scope="module")
def server(loose_home: Path) -> Iterator[LiveServer]:
    # --log info: the access log is on, so the test can see what it writes.
    env = {"LOCALCHAT_HOME": str(loose_home)}
    with live_server(["--backend", "fake", "--log", "info"], ui=True, env=env) as srv:
        yield srv


@pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")
def test_the_data_dir_and_its_files_become_owner_only(server: LiveServer, loose_home: Path) -> None:
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        r = client.post("/ui/chats", data={"content": "<<say:private>>"}, headers=HX)
        assert r.status_code == 200
        _wait_answers_done(client, loose_home)
    db = loose_home / "conversations.sqlite3"
    files = [
        db,
        db.with_name(db.name + "-wal"),
        db.with_name(db.name + "-shm"),
        loose_home / "logs/localchat.log",
    ]
    assert {f.name: oct(_mode(f)) for f in files} == {f.name: "0o600" for f in files}
    assert _mode(loose_home) == 0o700 and _mode(loose_home / "logs") == 0o700
    said = re.findall(r"readable by other users", server.log())
    assert len(said) == 1, server.log()[-2000:]
    assert "readable by other users" in (loose_home / "logs/localchat.log").read_text()  # the desktop's log


@pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")
def test_a_new_data_dir_is_created_owner_only(tmp_path: Path) -> None:
    home = tmp_path / "new" / "localchat"
    with live_server(["--backend", "fake"], ui=True, env={"LOCALCHAT_HOME": str(home)}) as srv:
        with httpx.Client(base_url=srv.base_url, timeout=30) as client:
            assert client.post("/ui/chats", data={"content": "<<say:hi>>"}, headers=HX).status_code == 200
            _wait_answers_done(client, home)
        assert "readable by other users" not in srv.log()
    assert _mode(home) == 0o700
    assert all(_mode(p) == 0o600 for p in home.rglob("*") if p.is_file()), [
        (p.name, oct(_mode(p))) for p in home.rglob("*")
    ]


def test_a_key_in_the_query_string_never_reaches_the_access_log(server: LiveServer) -> None:
    secret = "sk-never-log-me-123"
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        assert client.get(f"/v1/models?api_key={secret}&x=1").status_code == 200
        assert client.get("/health?marker=after-the-key").status_code == 200
    deadline = time.monotonic() + 10
    while "marker=after-the-key" not in server.log():  # the access log is written as the answer starts
        assert time.monotonic() < deadline, server.log()[-2000:]
        time.sleep(0.05)
    assert secret not in server.log()
    assert "/v1/models?api_key=***&x=1" in server.log()


@pytest.mark.parametrize("path", ["/v1/chat/completions/", "//v1/chat/completions", "/v1//chat/completions"])
def test_the_json_gate_sees_through_path_variants(server: LiveServer, path: str) -> None:
    body = json.dumps({"messages": say("pwned")})
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        # Raw bytes: HTTP clients clean such paths up before sending them.
        head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\n"
        sock.sendall(f"{head}Content-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}".encode())
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 415"), reply[:200]


def test_odd_paths_and_assets(server: LiveServer) -> None:
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        assert client.get("/static/x%00").status_code == 404
        loading = client.get("/static/loading.html")
        assert loading.status_code == 200 and loading.headers["x-content-type-options"] == "nosniff"
        assert "frame-ancestors 'none'" in loading.headers["content-security-policy"]
        assert client.get("/static/vendor/update.sh").status_code == 404
        nested = b'{"messages": ' + b"[" * 1000 + b"]" * 1000 + b"}"
        r = client.post("/v1/chat/completions", content=nested, headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"


def _closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(1024) == b""  # the server's FIN
    except ConnectionResetError:  # or a reset, which closes it just as well
        return True


def test_half_open_sockets_are_closed(server: LiveServer) -> None:
    """Slowloris: sockets that send nothing, or half a head, are closed after the head timeout; one in
    the middle of its body gets the longer idle-body time; the server answers meanwhile."""
    silent = [socket.create_connection(("127.0.0.1", server.port), timeout=30) for _ in range(20)]
    partial = [socket.create_connection(("127.0.0.1", server.port), timeout=30) for _ in range(20)]
    for sock in partial:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
    in_body = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    head = "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    in_body.sendall(f"{head}Content-Length: 1000\r\n\r\n{{".encode())
    started = time.monotonic()
    try:
        for sock in partial[:5]:  # dribbling more bytes does not reset the head's clock
            time.sleep(0.5)
            sock.sendall(b"x")
        assert httpx.get(server.base_url + "/health", timeout=5).status_code == 200
        for sock in silent + partial:
            assert _closed_by_server(sock), "expected the server to close the socket"
        waited = time.monotonic() - started
        assert 9 <= waited < 15, waited
        in_body.setblocking(False)
        with pytest.raises(BlockingIOError):
            in_body.recv(1)  # still open: its clock is the idle-body one
    finally:
        for sock in [*silent, *partial, in_body]:
            sock.close()


# -- no GET changes anything --------------------------------------------------------------------------


@pytest.fixture
def hub_server(fake_hub: Any, tmp_path: Path) -> Iterator[tuple[LiveServer, Path]]:
    cfg = tiny_config()
    tiny = write_tiny_gguf(tmp_path / "tiny-Q4_0.gguf", random_state_dict(cfg), cfg, qtype="Q4_0")
    fake_hub.add_repo(TINY, {"tiny-Q4_0.gguf": tiny})
    home = tmp_path / "data"
    args = ["--backend", "fake", "--max-loaded-models", "1"]
    with live_server(args, ui=True, env={"LOCALCHAT_HOME": str(home)}) as srv:
        yield srv, home


def _state(client: httpx.Client, home: Path) -> dict[str, Any]:
    tables = [t for (t,) in _rows(home, "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    return {
        "loaded": client.get("/health").json().get("loaded"),
        "models": sorted((m["id"], m.get("loaded")) for m in client.get("/v1/models").json()["data"]),
        "rows": {t: _rows(home, f"SELECT * FROM {t} ORDER BY rowid") for t in tables},
    }


def _fill(path: str, ids: dict[str, str]) -> str:
    """A route's path with real values for its parameters (unknown ones get a name nothing has)."""
    return re.sub(r"\{(\w+)(?::\w+)?\}", lambda m: ids.get(m.group(1), "nothing-here"), path)


def test_no_get_route_changes_anything(hub_server: tuple[LiveServer, Path], tmp_path: Path) -> None:
    from localchat.models.manager import ModelManager
    from localchat.server.app import create_app
    from tests.helpers.fake_app import fake_settings

    server, home = hub_server
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        with client.stream("POST", "/api/models/pull", json={"name": TINY}) as r:
            assert r.status_code == 200 and '"phase": "done"' in r.read().decode().replace('":"', '": "')
        r = client.post("/ui/chats", data={"content": "<<say:hello>>"}, headers=HX)
        conv_id = r.headers["hx-redirect"].rsplit("/", 1)[1]
        _wait_answers_done(client, home)
        message_id = str(_rows(home, "SELECT max(id) FROM messages")[0][0])
        before = _state(client, home)
        assert before["loaded"] == ["fake-model"]

        settings = fake_settings(ui=True, home=str(tmp_path / "routes"))
        app = create_app(settings, ModelManager(settings))
        ids = {"conv_id": conv_id, "message_id": message_id, "fmt": "json", "model_id": "fake-model"}
        ids["file_path"] = "app.js"
        queries = {"name": TINY, "model": TINY, "q": "tiny", "reload": "true", "next": "/"}
        called = []
        for route in app.routes:
            if "GET" not in getattr(route, "methods", ()):
                continue
            url = _fill(route.path, ids) + "?" + "&".join(f"{k}={v}" for k, v in queries.items())
            # A cross-site <img> or link sends no Origin and no htmx header; try both kinds.
            for headers in ({}, HX):
                response = client.get(url, headers=headers, timeout=10)
                assert response.status_code < 500, (url, response.status_code, response.text[:300])
            called.append(route.path)
        assert "/" in called and "/ui/model-status" in called and "/api/models/pull" in called
        time.sleep(0.5)  # a load would have started by now (it runs on a thread)
        after = _state(client, home)
        assert after == before, f"a GET changed the server: {before} -> {after}"

        # Switching models is the picker's POST (what "Use in chat" sends first).
        switch = client.post("/ui/model", data={"model": TINY, "open": "1"}, headers=HX)
        assert switch.status_code == 200 and switch.headers["hx-redirect"] == "/?model=org%2Ftiny-GGUF"
        deadline = time.monotonic() + 30
        while not (health := client.get("/health").json()).get("loaded", [""])[0].startswith(TINY):
            assert time.monotonic() < deadline, health
            time.sleep(0.05)


# -- a huge prompt, on the real model ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_server(smollm2_gguf: Path) -> Iterator[LiveServer]:
    if why := real_backend_missing():
        pytest.skip(f"real-model server not available: {why}")
    with live_server(server_args("real", smollm2_gguf), ui=True) as srv:
        yield srv


class HealthWatch:
    """Polls /health on a thread; records the slowest answer."""

    def __init__(self, url: str) -> None:
        self.url, self.worst, self.count = url, 0.0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                started = time.monotonic()
                assert client.get(self.url).status_code == 200
                self.worst, self.count = max(self.worst, time.monotonic() - started), self.count + 1
                time.sleep(0.02)

    def __enter__(self) -> HealthWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(30)


def _fox(chars: int) -> str:
    return ("The quick brown fox jumps over the lazy dog. " * (chars // 45 + 1))[:chars]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("route", "chars"),
    [
        ("/v1/chat/completions", 3_900_000),
        ("/v1/chat/completions", 500_000),
        ("/v1/responses", 500_000),
        ("/v1/completions", 500_000),
    ],
)
def test_a_huge_prompt_never_stalls_other_routes(real_server: LiveServer, route: str, chars: int) -> None:
    """3.9 M characters: refused by length before tokenizing. 500 k: within what the character check
    lets through for an 8 k context, so it is tokenized (a second or more), on a worker thread."""
    text = _fox(chars)
    body: dict[str, Any] = {
        "/v1/chat/completions": {"messages": [{"role": "user", "content": text}], "max_tokens": 1},
        "/v1/responses": {"input": text, "max_output_tokens": 16},
        "/v1/completions": {"prompt": text, "max_tokens": 1},
    }[route]
    with HealthWatch(real_server.base_url + "/health") as watch:
        time.sleep(0.2)
        started = time.monotonic()
        r = httpx.post(real_server.base_url + route, json=body, timeout=120)
        took = time.monotonic() - started
        time.sleep(0.1)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text[:300]
    assert watch.count >= 3 and watch.worst < 0.5, (watch.worst, watch.count, took)


@pytest.mark.slow
def test_the_web_chat_renders_long_histories_off_the_event_loop(real_server: LiveServer) -> None:
    """The UI's own path: a conversation of two near-limit messages (~400 k characters) is rendered and
    tokenized while /health keeps answering; the answer fails with the context error, shown in the chat."""
    message = _fox(190_000)
    with httpx.Client(base_url=real_server.base_url, timeout=120) as client:
        first = client.post("/ui/chats", data={"content": message}, headers=HX)
        conv_id = first.headers["hx-redirect"].rsplit("/", 1)[1]
        with HealthWatch(real_server.base_url + "/health") as watch:
            time.sleep(0.2)
            r = client.post(f"/ui/c/{conv_id}/messages", data={"content": message}, headers=HX)
            time.sleep(0.1)
        assert r.status_code == 200 and "context length" in r.text, r.text[-500:]
    assert watch.count >= 3 and watch.worst < 0.5, (watch.worst, watch.count)
