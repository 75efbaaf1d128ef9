"""MCP through `--mcp-config`: a stdio MCP server written for the tests with the official SDK (tests/helpers/mcp_calc_server.py), started by the
app at startup; on the fake backend, the scripted reply is the model's call. The server runs the
call, feeds the result back (the tool's answer scripts the model's next reply) and streams the run.
Servers are offered to chats only with "autoUse": true, and the API runs their tools only for a
caller with the API key (or with --mcp-allow-keyless-api)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from localchat.mcp import McpConfigError, load_mcp_config
from localchat.mcp.trust import ConsentStore
from localchat.server.openai.mcp_chat import MAX_TURNS
from tests.helpers.fake_app import fake_client, say
from tests.helpers.live_server import REPO, check_chat_stream, parse_sse

CALC_SERVER = REPO / "tests" / "helpers" / "mcp_calc_server.py"  # a stdio MCP server on the mcp SDK

pytestmark = pytest.mark.slow  # starts MCP server subprocesses

ADD = r'{"name": "add", "arguments": {"a": 2, "b": 3}}'


@pytest.fixture(scope="module")
def mcp_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("mcp")
    config = {
        "mcpServers": {
            "calc": {"command": sys.executable, "args": [str(CALC_SERVER)], "autoUse": True},
            "broken": {"command": str(folder / "no-such-program"), "autoUse": True},
        }
    }
    path = folder / "mcp.json"
    path.write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def client(mcp_config: Path):
    with fake_client(mcp_config=str(mcp_config), mcp_allow_keyless_api=True) as (c, ctx):
        c.ctx = ctx  # type: ignore[attr-defined]
        yield c


def test_servers_connect_at_startup_and_failures_are_reported(client):
    servers = {s["name"]: s for s in client.ctx.mcp.servers()}
    assert servers["calc"]["status"] == "connected" and servers["calc"]["transport"] == "stdio"
    assert [t["name"] for t in servers["calc"]["tools"]] == ["add", "explode", "markup"]
    assert servers["broken"]["status"] == "failed" and servers["broken"]["error"]


def test_the_server_runs_the_call_and_continues(client):
    r = client.post("/v1/chat/completions", json={"messages": say(ADD)})
    assert r.status_code == 200, r.text
    body = r.json()
    (choice,) = body["choices"]
    assert choice["finish_reason"] == "stop"
    message = choice["message"]
    assert message["content"] == "The sum is 5." and "tool_calls" not in message
    (run,) = message["mcp_tool_runs"]
    assert (
        run["server"] == "calc" and run["name"] == "add" and json.loads(run["arguments"]) == {"a": 2, "b": 3}
    )
    assert run["result"] == "<<say:The sum is 5.>>" and run["is_error"] is False
    # Usage counts both turns: the second prompt holds the first plus the call and its result.
    assert body["usage"]["completion_tokens"] == len(ADD) + 1 + len("The sum is 5.") + 1


def test_streamed_runs(client):
    with client.stream("POST", "/v1/chat/completions", json={"messages": say(ADD), "stream": True}) as r:
        events = parse_sse(b"".join(r.iter_bytes()))
    result = check_chat_stream(events)
    deltas = [e["choices"][0]["delta"] for e in events if isinstance(e, dict) and e["choices"]]
    runs = [d["mcp_tool_run"] for d in deltas if "mcp_tool_run" in d]
    assert [r["status"] for r in runs] == ["running", "done"] and runs[1]["result"] == "<<say:The sum is 5.>>"
    assert not any("tool_calls" in d for d in deltas)
    assert result["texts"] == ["The sum is 5."] and result["reasons"] == {0: "stop"}


def test_empty_tools_opt_out(client):
    message = client.post("/v1/chat/completions", json={"messages": say(ADD), "tools": []}).json()["choices"][
        0
    ]["message"]
    assert message["content"] == ADD and "mcp_tool_runs" not in message


def test_a_failing_tool_is_an_error_result_up_to_the_turn_limit(client):
    call = r'{"name": "explode", "arguments": {}}'
    r = client.post("/v1/chat/completions", json={"messages": say(call)})
    assert r.status_code == 200, r.text
    message = r.json()["choices"][0]["message"]
    runs = message["mcp_tool_runs"]
    # The fake model repeats the call after each error; the last turn is rendered without tools.
    assert len(runs) == MAX_TURNS - 1 and all(run["is_error"] and "explode" in run["result"] for run in runs)
    assert message["content"] == call
    assert client.get("/health").status_code == 200


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("{", "not valid JSON"),
        ('{"servers": {}}', "mcpServers"),
        ('{"mcpServers": {"x": {}}}', "either"),
        ('{"mcpServers": {"x": {"url": "ftp://x"}}}', "http(s)"),
        ('{"mcpServers": {"x": {"command": "a", "args": "b"}}}', "list of strings"),
        ('{"mcpServers": {"x": {"command": "a", "autoUse": "yes"}}}', "true or false"),
    ],
)
def test_bad_config_files_name_the_problem(tmp_path: Path, config: str, message: str):
    path = tmp_path / "mcp.json"
    path.write_text(config)
    with pytest.raises(McpConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_mcp_config(path)


def test_http_servers_are_read(tmp_path: Path):
    path = tmp_path / "mcp.json"
    path.write_text('{"mcpServers": {"web": {"url": "http://127.0.0.1:9/mcp", "headers": {"X": "y"}}}}')
    (spec,) = load_mcp_config(path)
    assert spec.transport == "http" and spec.headers == {"X": "y"}


@pytest.fixture(scope="module")
def http_mcp_url() -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, str(CALC_SERVER), "--http", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert proc.poll() is None and time.monotonic() < deadline, "the HTTP MCP server did not start"
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(10)


def test_streamable_http_server(http_mcp_url: str, tmp_path: Path):
    config = tmp_path / "mcp.json"
    web = {"url": http_mcp_url, "headers": {"X-Test": "1"}, "autoUse": True}
    config.write_text(json.dumps({"mcpServers": {"web": web}}))
    with fake_client(mcp_config=str(config), api_key="sesame") as (c, ctx):  # a keyed caller may
        (server,) = ctx.mcp.servers()
        assert server["status"] == "connected" and server["transport"] == "http", server
        auth = {"Authorization": "Bearer sesame"}
        r = c.post("/v1/chat/completions", json={"messages": say(ADD)}, headers=auth)
        message = r.json()["choices"][0]["message"]
    assert message["content"] == "The sum is 5." and message["mcp_tool_runs"][0]["server"] == "web"


def test_a_server_without_auto_use_is_never_offered_or_run(tmp_path: Path):
    config = tmp_path / "mcp.json"
    config.write_text(
        json.dumps({"mcpServers": {"calc": {"command": sys.executable, "args": [str(CALC_SERVER)]}}})
    )
    with fake_client(mcp_config=str(config)) as (c, ctx):
        (server,) = ctx.mcp.servers()
        assert server["status"] == "connected" and server["auto_use"] is False
        assert ctx.mcp.openai_tools() == []
        # Not offered: the model's call is plain text, nothing runs (and no key is needed for that).
        message = c.post("/v1/chat/completions", json={"messages": say(ADD)}).json()["choices"][0]["message"]
        assert message["content"] == ADD and "mcp_tool_runs" not in message
        # Nor can a forged call reach it (refused before the server is spoken to).
        run = asyncio.run(ctx.mcp.call("add", '{"a": 1, "b": 2}'))
        assert run.is_error and "not enabled" in run.text


def test_keyless_api_requests_are_refused_mcp_tools(mcp_config: Path):
    with fake_client(mcp_config=str(mcp_config)) as (c, _):
        r = c.post("/v1/chat/completions", json={"messages": say(ADD)})
        assert r.status_code == 403, r.text
        error = r.json()["error"]
        assert error["code"] == "mcp_requires_api_key" and error["type"] == "permission_error"
        assert "--mcp-allow-keyless-api" in error["message"] and "LOCALCHAT_API_KEY" in error["message"]
        forced = {"type": "function", "function": {"name": "add"}}
        r = c.post("/v1/chat/completions", json={"messages": say(ADD), "tool_choice": forced})
        assert r.status_code == 403, r.text
        # Without MCP tools the same caller still chats.
        r = c.post("/v1/chat/completions", json={"messages": say(ADD), "tools": []})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == ADD


def test_always_allowed_tools_are_kept_in_a_private_file(tmp_path: Path):
    path = tmp_path / "mcp-consent.json"
    store = ConsentStore(path)
    assert not store.allows("calc", "add")
    store.allow("calc", "add")
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert json.loads(path.read_text()) == {"always_allow": {"calc": ["add"]}}
    again = ConsentStore(path)
    assert (
        again.allows("calc", "add") and not again.allows("calc", "explode") and not again.allows("x", "add")
    )
    path.write_text("{not json")
    assert not ConsentStore(path).allows("calc", "add")  # unreadable: ask again, never crash
