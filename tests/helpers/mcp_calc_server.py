"""A stdio MCP server for tests, written with the official `mcp` SDK. Its results script the fake
model's next reply (`<<say:…>>`), so a test can play a whole tool-calling conversation.

Run as `python tests/helpers/mcp_calc_server.py` (the app starts it from an mcp.json)."""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer

app = MCPServer("calc")


@app.tool()
def add(a: int, b: int) -> str:
    """Add two integers."""
    return f"<<say:The sum is {a + b}.>>"


@app.tool()
def explode() -> str:
    """Always fails."""
    raise RuntimeError("kaboom")


@app.tool()
def markup() -> str:
    """Returns text that would run script if a page ever treated it as HTML."""
    return '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>'


if __name__ == "__main__":
    app.run()
