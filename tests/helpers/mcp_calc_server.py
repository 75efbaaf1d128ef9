"""A stdio MCP server for tests, written with the official `mcp` SDK. Its results script the fake
model's next reply (`<<say:…>>`), so a test can play a whole tool-calling conversation.

Run as `python tests/helpers/mcp_calc_server.py` (stdio: the app starts it from an mcp.json), or with
`--http PORT` to serve streamable HTTP on 127.0.0.1:PORT/mcp."""

from __future__ import annotations

import sys

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
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        app.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        app.run()
