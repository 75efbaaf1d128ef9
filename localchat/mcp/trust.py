"""Who may make the server run an MCP tool (the trust model is in docs/mcp.md).

- The API: only a caller that holds the API key, since a request picks the tool (`tool_choice`) and
  its arguments; without `--api-key` anyone who reaches the port could. `--mcp-allow-keyless-api`
  says the user accepts that.
- The web UI: the person at the browser, call by call (Allow / Deny), or for good per tool
  ("Always allow this tool"), remembered in `mcp-consent.json` in the data dir (mode 0600).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from localchat.errors import LocalchatError

if TYPE_CHECKING:
    from localchat.config import Settings

log = logging.getLogger(__name__)

CONSENT_FILE = "mcp-consent.json"
DENIED = "The user did not allow this tool call. Do not try it again; answer without it."


class McpNeedsApiKeyError(LocalchatError):
    status = 403
    type = "permission_error"
    code = "mcp_requires_api_key"


def check_api_caller(settings: Settings) -> None:
    """Raise unless an API request may have MCP tools run for it (see the module's docstring)."""
    if settings.api_key or settings.mcp_allow_keyless_api:
        return
    raise McpNeedsApiKeyError(
        "This server's MCP tools run only for API requests that carry the API key, and this server has "
        "none: start it with LOCALCHAT_API_KEY (or --api-key), or with --mcp-allow-keyless-api to let "
        'anyone who can reach it run them. Send "tools": [] to chat without MCP tools.',
        param="tools",
    )


class ConsentStore:
    """The tools the user allowed for good, per MCP server: {"always_allow": {"server": ["tool"]}}.
    Read once, written (0600, replaced atomically) on every change. A file we cannot read is
    treated as empty, so the worst case is asking again."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._allowed: dict[str, set[str]] = self._read()

    def allows(self, server: str, tool: str) -> bool:
        return tool in self._allowed.get(server, set())

    def allow(self, server: str, tool: str) -> None:
        with self._lock:
            self._allowed.setdefault(server, set()).add(tool)
            data = {"always_allow": {s: sorted(t) for s, t in sorted(self._allowed.items())}}
            tmp = self.path.with_name(self.path.name + ".tmp")
            # Created 0600 from the start: other local users must not learn (or change) what may run.
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=2)
            os.chmod(tmp, 0o600)  # O_CREAT's mode does not apply to a file that already existed
            os.replace(tmp, self.path)

    def _read(self) -> dict[str, set[str]]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("%s: cannot read it (%s); every MCP call will be asked again", self.path, exc)
            return {}
        allowed = data.get("always_allow") if isinstance(data, dict) else None
        if not isinstance(allowed, dict):
            return {}
        return {
            str(server): {t for t in tools if isinstance(t, str)}
            for server, tools in allowed.items()
            if isinstance(tools, list)
        }
