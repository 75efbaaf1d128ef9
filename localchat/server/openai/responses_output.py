"""Builds a Responses API answer from a choice's chat deltas (see chat_output.py): the `output`
items (reasoning, message, function_call) and, for streaming, the documented event sequence with
`sequence_number`s. The non-streamed response is what the same events add up to."""

from __future__ import annotations

import json
import uuid
from typing import Any


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponseWriter:
    def __init__(self, response: dict[str, Any]) -> None:
        self.response = response  # the skeleton: id, model, created_at, echoed request fields
        self.output: list[dict[str, Any]] = []
        self._seq = 0
        self._open: dict[str, Any] | None = None  # the item receiving deltas

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return event

    def snapshot(self, status: str) -> dict[str, Any]:
        return self.response | {"status": status, "output": [dict(item) for item in self.output]}

    def start(self) -> list[dict[str, Any]]:
        return [
            self.event("response.created", response=self.snapshot("in_progress")),
            self.event("response.in_progress", response=self.snapshot("in_progress")),
        ]

    def push(self, deltas: list[dict[str, Any]]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        for delta in deltas:
            if "reasoning_content" in delta:
                events += self._text("reasoning", delta["reasoning_content"])
            elif "content" in delta:
                events += self._text("message", delta["content"])
            for call in delta.get("tool_calls", ()):
                events += self._call(call)
        return events

    def finish(self, usage: dict[str, Any], truncated: bool) -> list[dict[str, Any]]:
        events = self._close()
        self.response["usage"] = usage
        status = "incomplete" if truncated else "completed"
        if truncated:
            self.response["incomplete_details"] = {"reason": "max_output_tokens"}
        kind = "response.incomplete" if truncated else "response.completed"
        return [*events, self.event(kind, response=self.snapshot(status))]

    # -- items ---------------------------------------------------------------------------------------

    def _text(self, kind: str, text: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if not text:
            return events
        item = self._open
        if item is None or item["type"] != kind:
            events += self._close()
            item = self._add(
                {
                    "type": "message",
                    "id": _id("msg"),
                    "status": "in_progress",
                    "role": "assistant",
                    "content": [],
                }
                if kind == "message"
                else {"type": "reasoning", "id": _id("rs"), "summary": [], "content": []},
                events,
            )
            part_type = "output_text" if kind == "message" else "reasoning_text"
            part: dict[str, Any] = {"type": part_type, "text": ""} | (
                {"annotations": [], "logprobs": []} if kind == "message" else {}
            )
            item["content"].append(part)
            if kind == "message":
                events.append(self._part_event("response.content_part.added", item, part=dict(part)))
        item["content"][0]["text"] += text
        name = "response.output_text.delta" if kind == "message" else "response.reasoning_text.delta"
        extra: dict[str, Any] = {"logprobs": []} if kind == "message" else {}
        events.append(self._part_event(name, item, delta=text, **extra))
        return events

    def _call(self, call: dict[str, Any]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if "id" in call:
            events += self._close()
            self._add(
                {
                    "type": "function_call",
                    "id": _id("fc"),
                    "call_id": call["id"],
                    "name": call["function"]["name"],
                    "arguments": "",
                    "status": "in_progress",
                },
                events,
            )
        piece = call["function"].get("arguments", "")
        if piece and self._open is not None:
            self._open["arguments"] += piece
            events.append(
                self.event(
                    "response.function_call_arguments.delta",
                    item_id=self._open["id"],
                    output_index=len(self.output) - 1,
                    delta=piece,
                )
            )
        return events

    def _add(self, item: dict[str, Any], events: list[dict[str, Any]]) -> dict[str, Any]:
        self.output.append(item)
        self._open = item
        events.append(
            self.event("response.output_item.added", output_index=len(self.output) - 1, item=_copy(item))
        )
        return item

    def _part_event(self, kind: str, item: dict[str, Any], **fields: Any) -> dict[str, Any]:
        return self.event(
            kind, item_id=item["id"], output_index=len(self.output) - 1, content_index=0, **fields
        )

    def _close(self) -> list[dict[str, Any]]:
        item, self._open = self._open, None
        if item is None:
            return []
        events: list[dict[str, Any]] = []
        index = len(self.output) - 1
        if item["type"] == "message":
            part = item["content"][0]
            events.append(self._part_event("response.output_text.done", item, text=part["text"], logprobs=[]))
            events.append(self._part_event("response.content_part.done", item, part=dict(part)))
        elif item["type"] == "reasoning":
            events.append(
                self._part_event("response.reasoning_text.done", item, text=item["content"][0]["text"])
            )
        else:
            events.append(
                self.event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    name=item["name"],
                    arguments=item["arguments"],
                )
            )
        if "status" in item:
            item["status"] = "completed"
        events.append(self.event("response.output_item.done", output_index=index, item=_copy(item)))
        return events

    def conversation_turn(self, call_id: Any) -> list[dict[str, Any]]:
        """The reply as template messages, for the next request's `previous_response_id`."""
        text = "".join(i["content"][0]["text"] for i in self.output if i["type"] == "message")
        calls = [
            {
                "id": call_id(i["call_id"]),
                "type": "function",
                "function": {"name": i["name"], "arguments": _loads(i["arguments"])},
            }
            for i in self.output
            if i["type"] == "function_call"
        ]
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if calls:
            message["tool_calls"] = calls
        return [message]


def _copy(item: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(item))


def _loads(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments
