"""Models without a tool-call format of their own: a reply that is a JSON call object
`{"name": ..., "arguments": {...}}` (or a list of them) is a call; anything else is text."""

from __future__ import annotations

from localchat.serving.tool_parsers.base import ToolParser


class JsonParser(ToolParser):
    name = "json"
    json_at_start = True
