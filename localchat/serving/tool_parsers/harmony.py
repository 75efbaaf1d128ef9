"""gpt-oss's harmony format: calls are messages addressed `to=functions.NAME` (see serving/harmony.py),
not JSON in markup, so one reader splits the whole output into reasoning, content and calls. The
markers are special tokens: a model that speaks harmony is decoded with its special tokens kept."""

from __future__ import annotations

from localchat.serving.harmony import HarmonyReader, Piece
from localchat.serving.tool_parsers.base import ToolParser
from localchat.serving.tool_parsers.stream import CallDelta, Event


class HarmonyParser(ToolParser):
    name = "harmony"
    keeps_special_tokens = True
    # A forced call is not prefix + JSON + suffix here: structured/harmony_grammar.py writes its header.
    can_force = False


class HarmonyOutput:
    """One choice's output: `push` returns (reasoning, events) like a ReasoningSplitter feeding a
    ToolCallStream. Without offered tools (`names` empty) a call's body is content; with
    `max_calls`, later calls are dropped."""

    def __init__(self, parser: ToolParser, names: set[str], max_calls: int | None) -> None:
        self._reader = HarmonyReader()
        self._parser = parser
        self._calls_allowed = bool(names)
        self._max_calls = max_calls
        self.num_calls = 0
        self._emitting = False  # the open call's arguments are sent

    def push(self, text: str) -> tuple[str, list[Event]]:
        return self._events(self._reader.push(text))

    def flush(self) -> tuple[str, list[Event]]:
        return self._events(self._reader.flush())

    def _events(self, pieces: list[Piece]) -> tuple[str, list[Event]]:
        reasoning: list[str] = []
        events: list[Event] = []
        for p in pieces:
            if p.kind == "reasoning":
                reasoning.append(p.text)
            elif p.kind == "content":
                events.append(p.text)
            elif p.kind == "call":
                self._start_call(p.text, events)
            elif self._emitting:
                events.append(CallDelta(self.num_calls - 1, arguments=p.text))
            elif not self._calls_allowed:
                events.append(p.text)
        return "".join(reasoning), events

    def _start_call(self, name: str, events: list[Event]) -> None:
        full = self._max_calls is not None and self.num_calls >= self._max_calls
        self._emitting = self._calls_allowed and not full
        if self._emitting:
            events.append(CallDelta(self.num_calls, self._parser.new_call_id(), name))
            self.num_calls += 1
