"""Responses kept for `previous_response_id`: each id maps to the conversation so far (template
messages, the reply included), in memory for the server's lifetime, oldest dropped beyond a bound."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from localchat.errors import NotFoundError

MAX_STORED_RESPONSES = 1000


class ResponseStore:
    def __init__(self, capacity: int = MAX_STORED_RESPONSES) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, response_id: str, conversation: list[dict[str, Any]]) -> None:
        with self._lock:
            self._items[response_id] = conversation
            self._items.move_to_end(response_id)
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)

    def conversation(self, response_id: str) -> list[dict[str, Any]]:
        with self._lock:
            found = self._items.get(response_id)
            if found is None:
                raise NotFoundError(
                    f"No response {response_id!r} on this server (responses are kept in memory, the last "
                    f"{self.capacity}, until it restarts). Send the whole conversation as 'input' instead.",
                    param="previous_response_id",
                )
            self._items.move_to_end(response_id)
            return list(found)
