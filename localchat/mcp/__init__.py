"""MCP: the tool servers of `--mcp-config`, whose tools chat requests may call (the server runs them)."""

from localchat.mcp.config import McpConfigError, McpServerSpec, load_mcp_config
from localchat.mcp.hub import McpHub, ToolRun

__all__ = ["McpConfigError", "McpHub", "McpServerSpec", "ToolRun", "load_mcp_config"]
