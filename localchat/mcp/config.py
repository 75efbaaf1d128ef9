"""`--mcp-config mcp.json` in the Claude-desktop format:

    {"mcpServers": {"files": {"command": "npx", "args": [...], "env": {...}},
                    "search": {"url": "http://127.0.0.1:9000/mcp", "headers": {...}, "autoUse": true}}}

A server with `command` is started as a subprocess and spoken to over stdio; one with `url` over
streamable HTTP. Read once at startup; a file we cannot use stops the start with a message naming it.
`autoUse` (default false) offers the server's tools to chats; a server without it is connected and
listed, but its tools run for nobody (see docs/mcp.md for the trust model).
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localchat.errors import LocalchatError


class McpConfigError(LocalchatError):
    status = 400
    type = "invalid_settings"
    code = "invalid_mcp_config"


@dataclass(frozen=True, slots=True)
class McpServerSpec:
    name: str
    command: str | None = None
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    url: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    auto_use: bool = False  # "autoUse": the server's tools are offered to chats (opt-in)

    @property
    def transport(self) -> str:
        return "stdio" if self.command else "http"


def load_mcp_config(path: str | Path) -> list[McpServerSpec]:
    where = f"--mcp-config {path}"
    if importlib.util.find_spec("mcp") is None:
        raise McpConfigError(f'{where}: the MCP SDK is not installed; pip install "localchat-app[mcp]".')
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise McpConfigError(f"{where}: cannot read the file ({exc.strerror or exc}).") from None
    except ValueError as exc:
        raise McpConfigError(f"{where}: not valid JSON ({exc}).") from None
    servers = data.get("mcpServers") if isinstance(data, dict) else None
    if not isinstance(servers, dict):
        raise McpConfigError(f'{where}: expected {{"mcpServers": {{"name": {{...}}}}}} at the top level.')
    return [_server(name, entry, where) for name, entry in servers.items()]


def _server(name: str, entry: Any, where: str) -> McpServerSpec:
    if not isinstance(entry, dict):
        raise McpConfigError(f"{where}: server {name!r} must be an object.")
    command, url = entry.get("command"), entry.get("url")
    if (command is None) == (url is None):
        raise McpConfigError(f'{where}: server {name!r} needs either "command" (stdio) or "url" (HTTP).')
    args, env, headers = entry.get("args", []), entry.get("env", {}), entry.get("headers", {})
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise McpConfigError(f'{where}: server {name!r}: "args" must be a list of strings.')
    for key, value in (("env", env), ("headers", headers)):
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise McpConfigError(f'{where}: server {name!r}: "{key}" must map names to strings.')
    if command is not None and not isinstance(command, str):
        raise McpConfigError(f'{where}: server {name!r}: "command" must be a string.')
    if url is not None and not (isinstance(url, str) and url.startswith(("http://", "https://"))):
        raise McpConfigError(f'{where}: server {name!r}: "url" must be an http(s) URL.')
    auto_use = entry.get("autoUse", False)
    if not isinstance(auto_use, bool):
        raise McpConfigError(f'{where}: server {name!r}: "autoUse" must be true or false.')
    return McpServerSpec(name, command, list(args), dict(env), url, dict(headers), auto_use)
