"""MCP end to end on the real model: `localchat serve --mcp-config` starts a stdio MCP server written
with the official SDK (tests/helpers/mcp_calc_server.py); the request names the server's tool in
`tool_choice`, so constrained decoding makes SmolLM2 call it, and the server runs it and answers.
The server opts in with "autoUse", and the caller holds the API key (MCP runs need one)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.helpers.live_server import REPO, LiveServer, live_server, real_backend_missing, server_args

pytestmark = pytest.mark.slow

CALC_SERVER = REPO / "tests" / "helpers" / "mcp_calc_server.py"
KEY = "mcp-e2e-key"


@pytest.fixture(scope="module")
def mcp_server(smollm2_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    if why := real_backend_missing():
        pytest.skip(why)
    config = tmp_path_factory.mktemp("mcp") / "mcp.json"
    config.write_text(
        json.dumps(
            {"mcpServers": {"calc": {"command": sys.executable, "args": [str(CALC_SERVER)], "autoUse": True}}}
        )
    )
    args = [*server_args("real", smollm2_gguf), "--mcp-config", str(config)]
    with live_server(args, api_key=KEY) as server:
        yield server


def test_forced_mcp_call_runs_on_the_server(mcp_server):
    client = openai.OpenAI(base_url=mcp_server.api_url, api_key=KEY, max_retries=0, timeout=300)
    model = client.models.list().data[0].id
    reply = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "What is 2 plus 3? Use the add tool."}],
        tool_choice={"type": "function", "function": {"name": "add"}},
        temperature=0,
        max_tokens=48,
    )
    choice = reply.choices[0]
    runs = choice.message.model_extra["mcp_tool_runs"]
    assert runs and runs[0]["server"] == "calc" and runs[0]["name"] == "add" and not runs[0]["is_error"]
    args = json.loads(runs[0]["arguments"])
    assert runs[0]["result"] == f"<<say:The sum is {args['a'] + args['b']}.>>"
    assert not choice.message.tool_calls  # the server ran the call: nothing left for the client
    assert choice.finish_reason in ("stop", "length")
    assert reply.usage.prompt_tokens > 0
