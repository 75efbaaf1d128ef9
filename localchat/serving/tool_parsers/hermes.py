"""Hermes / Qwen 2.5+ / Qwen 3: `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, one block per
call. Some tokenizers make the tags special tokens, which detokenizing drops: a bare call at the start
of the reply (naming one of the request's tools) counts too."""

from __future__ import annotations

from localchat.serving.tool_parsers.base import ToolParser


class HermesParser(ToolParser):
    name = "hermes"
    markers = (("<tool_call>", "</tool_call>"),)
    json_at_start = True
    forced_prefix = "<tool_call>\n"
    forced_suffix = "\n</tool_call>"
