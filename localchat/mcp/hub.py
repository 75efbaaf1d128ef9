"""The MCP servers of `--mcp-config`, connected at startup through the official `mcp` SDK.

Each server lives in its own task on the app's event loop (the SDK's connections are task-scoped),
from startup until shutdown. A server that fails to start, or a tool call that fails, is logged and
reported (in `servers()` and as an error result); it never stops the app or a chat request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from dataclasses import dataclass, field
from typing import Any

from localchat.mcp.config import McpServerSpec

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 30.0
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")  # what OpenAI (and the chat route) accept
CALL_TIMEOUT_S = 120.0


@dataclass(slots=True)
class ToolRun:
    server: str
    text: str
    is_error: bool
    denied: bool = False  # the user said no in the web UI: the tool did not run


@dataclass(slots=True)
class _Server:
    spec: McpServerSpec
    status: str = "connecting"  # connecting | connected | failed | stopped
    error: str | None = None
    tools: list[Any] = field(default_factory=list)  # mcp Tool objects
    client: Any = None
    task: asyncio.Task[None] | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    stop: asyncio.Event = field(default_factory=asyncio.Event)


class McpHub:
    def __init__(
        self,
        specs: list[McpServerSpec],
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        call_timeout_s: float = CALL_TIMEOUT_S,
    ) -> None:
        self._servers = [_Server(spec) for spec in specs]
        self.connect_timeout_s = connect_timeout_s
        self.call_timeout_s = call_timeout_s
        self._owner: dict[str, _Server] = {}  # tool name -> the server that runs it

    async def start(self) -> None:
        for server in self._servers:
            server.task = asyncio.create_task(self._run(server), name=f"mcp:{server.spec.name}")
        for server in self._servers:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(server.ready.wait(), self.connect_timeout_s)
            if server.status == "connecting":
                server.status, server.error = "failed", f"no answer within {self.connect_timeout_s:g} s"
                log.warning("MCP server %r: %s", server.spec.name, server.error)
                assert server.task is not None
                server.task.cancel()
        for server in self._servers:
            for tool in server.tools if server.status == "connected" else ():
                if not _TOOL_NAME.match(tool.name):
                    log.warning(
                        "MCP tool %r of server %r: not a valid function name, skipped",
                        tool.name,
                        server.spec.name,
                    )
                    continue
                if tool.name in self._owner:
                    log.warning(
                        "MCP tool %r of server %r is hidden by server %r's tool of the same name",
                        tool.name,
                        server.spec.name,
                        self._owner[tool.name].spec.name,
                    )
                    continue
                self._owner[tool.name] = server

    async def close(self) -> None:
        for server in self._servers:
            server.stop.set()
        tasks = [s.task for s in self._servers if s.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=10)

    async def _run(self, server: _Server) -> None:
        name = server.spec.name
        try:
            async with contextlib.AsyncExitStack() as stack:
                server.client = await stack.enter_async_context(_client(server.spec, stack))
                server.tools = await _list_tools(server.client)
                server.status = "connected"
                log.info("MCP server %r connected: %d tools", name, len(server.tools))
                server.ready.set()
                await server.stop.wait()
        except asyncio.CancelledError:
            pass
        except Exception as exc:  # a foreign process or URL: every failure is that server's, not ours
            server.error = _describe(exc)
            log.warning("MCP server %r failed: %s", name, server.error)
        finally:
            server.client = None
            if server.error is not None or server.status == "connecting":
                server.status = "failed"
            elif server.stop.is_set():
                server.status = "stopped"
            server.ready.set()

    # -- what requests use ---------------------------------------------------------------------------

    def openai_tools(self) -> list[dict[str, Any]]:
        """The tools of the connected servers that opted in to automatic use ("autoUse"), as OpenAI
        function tools. A server without it is never offered: pasted text cannot reach its tools."""
        return [
            {
                "type": "function",
                "function": {
                    k: v
                    for k, v in (
                        ("name", tool.name),
                        ("description", tool.description),
                        ("parameters", tool.input_schema or {"type": "object", "properties": {}}),
                    )
                    if v is not None
                },
            }
            for server in self._servers
            if server.status == "connected" and server.spec.auto_use
            for tool in server.tools
            if self._owner.get(tool.name) is server  # names are unique: the first server keeps one
        ]

    def server_of(self, tool_name: str) -> str | None:
        owner = self._owner.get(tool_name)
        return owner.spec.name if owner is not None else None

    async def call(self, tool_name: str, arguments: str) -> ToolRun:
        """Run a tool; failures come back as an error result for the model (and the client) to read."""
        owner = self._owner.get(tool_name)
        if owner is None:
            return ToolRun("", f"Unknown tool {tool_name!r}.", True)
        server = owner.spec.name
        if not owner.spec.auto_use:  # never offered, so only a forged call could name it
            return ToolRun(server, f"MCP server {server!r} is not enabled for chats (autoUse).", True)
        if owner.client is None:
            return ToolRun(
                server, f"MCP server {server!r} is not connected ({owner.error or owner.status}).", True
            )
        try:
            args = json.loads(arguments) if arguments.strip() else {}
        except ValueError as exc:
            return ToolRun(server, f"The arguments are not valid JSON ({exc}).", True)
        if not isinstance(args, dict):
            return ToolRun(server, "The arguments must be a JSON object.", True)
        try:
            result = await asyncio.wait_for(owner.client.call_tool(tool_name, args), self.call_timeout_s)
        except asyncio.TimeoutError:
            log.warning("MCP tool %r on %r timed out", tool_name, server)
            return ToolRun(server, f"The tool did not answer within {self.call_timeout_s:g} s.", True)
        except Exception as exc:
            log.warning("MCP tool %r on %r failed: %s", tool_name, server, _describe(exc))
            return ToolRun(server, f"The tool failed: {_describe(exc)}", True)
        return ToolRun(server, _result_text(result), bool(result.is_error))

    def servers(self) -> list[dict[str, Any]]:
        """For the UI: each server, its state and its tools."""
        return [
            {
                "name": s.spec.name,
                "transport": s.spec.transport,
                "status": s.status,
                "error": s.error,
                "auto_use": s.spec.auto_use,
                "tools": [{"name": t.name, "description": t.description or ""} for t in s.tools],
            }
            for s in self._servers
        ]


def _client(spec: McpServerSpec, stack: contextlib.AsyncExitStack) -> Any:
    from mcp import Client, StdioServerParameters

    if spec.command is not None:
        return Client(StdioServerParameters(command=spec.command, args=spec.args, env=spec.env or None))
    assert spec.url is not None
    if not spec.headers:
        return Client(spec.url)
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    http = create_mcp_http_client(headers=spec.headers)
    stack.push_async_callback(http.aclose)
    return Client(streamable_http_client(spec.url, http_client=http))


async def _list_tools(client: Any) -> list[Any]:
    tools: list[Any] = []
    cursor = None
    while True:
        page = await client.list_tools(cursor=cursor)
        tools += page.tools
        cursor = page.next_cursor
        if not cursor:
            return tools


def _result_text(result: Any) -> str:
    texts = []
    for block in result.content or []:
        text = getattr(block, "text", None)
        texts.append(text if isinstance(text, str) else block.model_dump_json(exclude_none=True))
    if not texts and result.structured_content is not None:
        texts.append(json.dumps(result.structured_content))
    return "\n".join(texts)


def _describe(exc: BaseException) -> str:
    inner = getattr(exc, "exceptions", None)  # an exception group (the SDK's task groups raise them)
    if inner:
        return _describe(inner[0])
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
