"""Fixed pool of per-sequence state slots for hybrid models (linear-attention / state-space layers).

Such layers keep a fixed-size state per sequence (a conv window plus a recurrent matrix) instead of a
growing KV cache. The runner holds one state tensor per layer with `num_slots` rows; this pool hands
the rows out. A request takes a slot when it is admitted and gives it back when it finishes or is
preempted: preemption is recompute, so a re-admitted request gets a fresh slot and rebuilds its state
from the prompt (and the tokens it already generated), exactly as its KV blocks are rebuilt.
The runner's rows past `num_slots` hold prefix-cache checkpoints (engine/state_checkpoints.py).
"""

from __future__ import annotations

import logging
from typing import Any

from localchat.engine.config import EngineConfig
from localchat.engine.interface import StateCacheSpec

log = logging.getLogger("localchat.engine.engine")


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


def plan_state_slots(
    max_num_seqs: int, checkpoints: int, budget: int, bytes_per_slot: int
) -> tuple[int, int]:
    """(running slots, checkpoint slots) for a memory budget of `budget` bytes. Checkpoints
    (engine/state_checkpoints.py) take at most a quarter of it; the running slots then at most half
    of what is left (a slot can cost tens of MiB: Qwen3.5-9B 49), so a small budget runs fewer
    sequences at once instead of leaving no room for K/V. At least one running slot, always."""
    checkpoints = max(0, min(checkpoints, budget // 4 // bytes_per_slot))
    budget -= checkpoints * bytes_per_slot
    return max(1, min(max_num_seqs, budget // 2 // bytes_per_slot)), checkpoints


def start_state_pool(
    runner: Any,
    spec: StateCacheSpec,
    config: EngineConfig,
    num_slots: int,
    num_checkpoints: int,
    num_spec_rows: int = 0,
) -> StateSlotPool:
    """Give the runner its state rows ([0, num_slots) run sequences, then the checkpoints, then the spec
    rows of speculative verify steps: engine/hybrid_spec.py) and log it."""
    runner.initialize_state_cache(num_slots + num_checkpoints + num_spec_rows)
    log.info(
        "State cache: %d slots (max_num_seqs %d) + %d prefix checkpoints of %.2f MiB for %d recurrent "
        "layers, %.0f MiB",
        num_slots,
        config.max_num_seqs,
        num_checkpoints,
        spec.bytes_per_slot / 2**20,
        spec.num_layers,
        (num_slots + num_checkpoints) * spec.bytes_per_slot / 2**20,
    )
    return StateSlotPool(num_slots)
