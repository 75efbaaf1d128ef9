"""One chat choice's generated text as OpenAI deltas: reasoning, content and tool calls kept apart
(a delta never mixes text and call markup), and the same deltas folded into a non-streamed message.
Both paths run the same splitters, so streamed and non-streamed answers agree."""

from __future__ import annotations

from typing import Any

from localchat.serving.reasoning import ReasoningSplitter
from localchat.serving.tool_parsers import CallDelta, HarmonyOutput, ToolCallStream
from localchat.serving.tool_parsers.stream import Event


class ChoiceDeltas:
    def __init__(self, in_reasoning: bool, tools: ToolCallStream | None) -> None:
        self._reasoning = ReasoningSplitter(in_reasoning)
        self._tools = tools
        # harmony (gpt-oss) marks reasoning, content and calls alike: one reader splits all three
        self._harmony = (
            HarmonyOutput(tools.parser, tools.names, tools.max_calls)
            if tools is not None and tools.parser.keeps_special_tokens
            else None
        )

    @property
    def num_calls(self) -> int:
        if self._harmony is not None:
            return self._harmony.num_calls
        return self._tools.num_calls if self._tools is not None else 0

    def push(self, text: str) -> list[dict[str, Any]]:
        if self._harmony is not None:
            return self._deltas(*self._harmony.push(text))
        reasoning, content = self._reasoning.push(text)
        return self._deltas(reasoning, self._call_events(content, final=False))

    def flush(self) -> list[dict[str, Any]]:
        if self._harmony is not None:
            return self._deltas(*self._harmony.flush())
        reasoning, content = self._reasoning.flush()
        return self._deltas(reasoning, self._call_events(content, final=True))

    def _call_events(self, content: str, final: bool) -> list[Event]:
        if self._tools is None:
            return [content] if content else []
        events = self._tools.push(content) if content else []
        if final:
            events += self._tools.flush()
        return events

    def _deltas(self, reasoning: str, events: list[Event]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if reasoning:
            out.append({"reasoning_content": reasoning, "reasoning": reasoning})
        for e in events:
            if isinstance(e, str):
                out.append({"content": e})
            elif e.id is None and out and _call_index(out[-1]) == e.index:
                out[-1]["tool_calls"][0]["function"]["arguments"] += e.arguments
            else:
                out.append({"tool_calls": [_call_delta(e)]})
        return out


def _call_index(delta: dict[str, Any]) -> int | None:
    calls = delta.get("tool_calls")
    return calls[0]["index"] if calls else None


def _call_delta(e: CallDelta) -> dict[str, Any]:
    if e.id is None:
        return {"index": e.index, "function": {"arguments": e.arguments}}
    return {"index": e.index, "id": e.id, "type": "function", "function": {"name": e.name, "arguments": ""}}


def message_of(deltas: list[dict[str, Any]]) -> dict[str, Any]:
    """The non-streamed `message` the deltas add up to."""
    content = "".join(d.get("content", "") for d in deltas)
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    calls: list[dict[str, Any]] = []
    for d in deltas:
        for c in d.get("tool_calls", ()):
            if "id" in c:
                calls.append({"id": c["id"], "type": "function", "function": dict(c["function"])})
            else:
                calls[c["index"]]["function"]["arguments"] += c["function"]["arguments"]
    message: dict[str, Any] = {
        "role": "assistant",
        "content": content if content or not calls else None,
        "refusal": None,
    }
    if reasoning:
        message["reasoning_content"] = message["reasoning"] = reasoning
    if calls:
        message["tool_calls"] = calls
    return message
