"""What every tool-call format declares. The formats differ only in their markup; one incremental
machine (stream.py) reads them all, so each format is a few class attributes.

A call's JSON is always `{"name": NAME, ARGUMENTS_KEY: {...}}`. `forced_prefix` + that JSON +
`forced_suffix` is the text a forced call (`tool_choice` required or named) is constrained to.
"""

from __future__ import annotations

import uuid
from typing import ClassVar


class ToolParser:
    name: ClassVar[str] = "base"
    # (opening, closing) markup around the calls; closing "" means the calls run to a non-call text.
    markers: ClassVar[tuple[tuple[str, str], ...]] = ()
    # A bare JSON call object (or list of them) at the very start of the output is a call too.
    json_at_start: ClassVar[bool] = False
    forced_prefix: ClassVar[str] = ""
    forced_suffix: ClassVar[str] = ""
    arguments_key: ClassVar[str] = "arguments"
    # The format's markup is special tokens, so the output is decoded with them (harmony).
    keeps_special_tokens: ClassVar[bool] = False
    # tool_choice "required" / named can be enforced with forced_prefix + JSON + forced_suffix.
    can_force: ClassVar[bool] = True

    def new_call_id(self) -> str:
        return f"call_{uuid.uuid4().hex[:24]}"

    def template_call_id(self, call_id: str) -> str:
        """The id as the chat template wants it back in the next turn (most accept any string)."""
        return call_id
