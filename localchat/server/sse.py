"""Server-sent events as OpenAI clients read them: `data: <json>\\n\\n` per event, `data: [DONE]` last,
`:` comment lines as keep-alives, and an error after the stream started as one `data: {"error": …}`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec

from localchat.server.errors import error_for

KEEPALIVE_S = 15.0  # a comment line this often while a request waits, so proxies keep the connection
KEEPALIVE = b": keep-alive\n\n"
DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

_encode = msgspec.json.Encoder().encode


def event(payload: Any) -> bytes:
    return b"data: " + _encode(payload) + b"\n\n"


class ListEvents:
    """`event(head | {key: [item]} | tail)` for a stream of such events that differ only in `item`: the
    bytes around the item are encoded once, each event encodes its item alone (a streamed token's chunk
    repeats its id, model and fingerprint: #34). `head` and `tail` must not hold `key`."""

    def __init__(self, head: dict[str, Any], key: str, tail: dict[str, Any]) -> None:
        assert key not in head and key not in tail
        around = _encode(head | {key: [None]} | tail)
        cut = around.index(b"[null]", len(_encode(head)) - 1)  # the list's place, after head's fields
        self._before = b"data: " + around[: cut + 1]
        self._after = around[cut + 5 :] + b"\n\n"

    def __call__(self, item: Any) -> bytes:
        return self._before + _encode(item) + self._after


def error_event(exc: BaseException) -> bytes:
    return event(error_for(exc)[1])


async def guarded(events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """Ends every stream with [DONE]; a failure mid-stream becomes one error event first."""
    try:
        async for chunk in events:
            yield chunk
    except Exception as exc:  # the status line is already sent: the error must travel in the stream
        yield error_event(exc) + DONE
        return
    yield DONE
