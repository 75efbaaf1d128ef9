"""Mistral (v0.3 and later): `[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]`. `[TOOL_CALLS]` is
a special token, so detokenized text usually lacks it: a bare call list at the start counts too. Its
templates insist on 9-character alphanumeric call ids when the calls come back in the next turn."""

from __future__ import annotations

import hashlib

from localchat.serving.tool_parsers.base import ToolParser


class MistralParser(ToolParser):
    name = "mistral"
    markers = (("[TOOL_CALLS]", ""),)
    json_at_start = True
    forced_prefix = "[TOOL_CALLS] ["
    forced_suffix = "]"

    def template_call_id(self, call_id: str) -> str:
        # Stable, so an assistant's call and the tool result that answers it keep matching ids.
        if len(call_id) == 9 and call_id.isalnum():
            return call_id
        return hashlib.sha256(call_id.encode()).hexdigest()[:9]
