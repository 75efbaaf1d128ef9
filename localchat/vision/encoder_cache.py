"""A small LRU of encoder outputs keyed by an image's content hash: the same picture sent again (the
next turn of a chat resends the whole history) is not encoded again. Hits and misses are counted for
the metrics."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

V = TypeVar("V")


class EncoderCache(Generic[V]):
    def __init__(self, capacity: int = 16) -> None:
        self.capacity = capacity
        self.hits = 0
        self.misses = 0
        self._items: OrderedDict[str, V] = OrderedDict()

    def get_or_encode(self, key: str, encode: Callable[[], V]) -> V:
        if key in self._items:
            self.hits += 1
            self._items.move_to_end(key)
            return self._items[key]
        self.misses += 1
        value = encode()
        self._items[key] = value
        if len(self._items) > self.capacity:
            self._items.popitem(last=False)  # the least recently used picture
        return value

    def __len__(self) -> int:
        return len(self._items)
