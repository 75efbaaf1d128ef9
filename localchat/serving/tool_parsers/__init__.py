"""Tool-call formats, and which one a model speaks: `--tool-call-parser`, else the catalog entry's
`tool_call` field, else what its chat template writes, else plain JSON."""

from __future__ import annotations

from localchat.serving.tool_parsers.base import ToolParser
from localchat.serving.tool_parsers.harmony import HarmonyOutput, HarmonyParser
from localchat.serving.tool_parsers.hermes import HermesParser
from localchat.serving.tool_parsers.json_fallback import JsonParser
from localchat.serving.tool_parsers.llama3 import Llama3Parser
from localchat.serving.tool_parsers.mistral import MistralParser
from localchat.serving.tool_parsers.stream import CallDelta, ParsedCall, ParsedOutput, ToolCallStream, parse

PARSERS: dict[str, type[ToolParser]] = {
    p.name: p for p in (HermesParser, Llama3Parser, MistralParser, HarmonyParser, JsonParser)
}
PARSER_CHOICES = ("auto", *PARSERS)

# What a template writes when it teaches the model a format, first match wins.
_TEMPLATE_HINTS = (
    ("<|channel|>", "harmony"),  # gpt-oss
    ("<tool_call>", "hermes"),
    ("[TOOL_CALLS]", "mistral"),
    ("<|python_tag|>", "llama3"),
    ('"parameters": dictionary of argument name', "llama3"),
)


def pick_parser(
    setting: str = "auto", template_source: str | None = None, catalog_hint: str | None = None
) -> ToolParser:
    if setting != "auto":
        return PARSERS[setting]()
    if catalog_hint in PARSERS:
        return PARSERS[catalog_hint]()
    for needle, name in _TEMPLATE_HINTS:
        if template_source and needle in template_source:
            return PARSERS[name]()
    return JsonParser()


__all__ = [
    "PARSERS",
    "PARSER_CHOICES",
    "CallDelta",
    "HarmonyOutput",
    "HarmonyParser",
    "JsonParser",
    "ParsedCall",
    "ParsedOutput",
    "ToolCallStream",
    "ToolParser",
    "parse",
    "pick_parser",
]
