"""Fixed pool of per-sequence state slots for hybrid models (linear-attention / state-space layers).

Such layers keep a fixed-size state per sequence (a conv window plus a recurrent matrix) instead of a
growing KV cache. The runner holds one state tensor per layer with `num_slots` rows; this pool hands
the rows out. A request takes a slot when it is admitted and gives it back when it finishes or is
preempted: preemption is recompute, so a re-admitted request gets a fresh slot and rebuilds its state
from the prompt (and the tokens it already generated), exactly as its KV blocks are rebuilt.
"""

from __future__ import annotations


class StateSlotPool:
    def __init__(self, num_slots: int) -> None:
        assert num_slots >= 1, "a hybrid model needs at least one state slot"
        self.num_slots = num_slots
        # Lowest index first: a short-lived server keeps touching the same few rows (warm in cache).
        self._free = list(range(num_slots - 1, -1, -1))
        self.slots: dict[str, int] = {}  # req_id -> slot

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_slots - len(self._free)

    def allocate(self, req_id: str) -> int | None:
        """A slot for `req_id` (its own if it already has one), or None when every slot is taken."""
        if req_id in self.slots:
            return self.slots[req_id]
        if not self._free:
            return None
        slot = self._free.pop()
        self.slots[req_id] = slot
        return slot

    def free(self, req_id: str) -> None:
        slot = self.slots.pop(req_id, None)
        if slot is not None:
            self._free.append(slot)
            self._free.sort(reverse=True)
