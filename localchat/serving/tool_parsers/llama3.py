"""Llama 3.1 / 3.2 / 3.3: the reply is `{"name": ..., "parameters": {...}}` (calls separated by `;`),
sometimes after `<|python_tag|>` (a special token, so usually already dropped from the text)."""

from __future__ import annotations

from localchat.serving.tool_parsers.base import ToolParser


class Llama3Parser(ToolParser):
    name = "llama3"
    markers = (("<|python_tag|>", ""),)
    json_at_start = True
    arguments_key = "parameters"
