"""The MLX side of the hybrid cache: per-layer state arrays indexed by the engine's state slots
(localchat/engine/state_slots.py), as localchat/backends/torch/state_cache.py does for torch.

Each stateful layer owns a conv window [slots, C, K - 1] (compute dtype) and a recurrent state
[slots, H, dk, dv] (float32: it accumulates over the whole sequence). Writes go through
`array[slots] = new`, MLX's in-place scatter (see attention.py: nothing may hold the old arrays).
Speculative verify rows (`StepRows.verify`, engine/hybrid_spec.py) run token by token in the decode
form, each position's state copied into the spec row `BatchInputs.state_keep` names.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np


@dataclass(frozen=True, slots=True)
class LayerStateShape:
    conv_channels: int
    conv_width: int  # K - 1 inputs kept
    heads: int
    key_dim: int
    value_dim: int

    def bytes_per_slot(self, dtype: mx.Dtype) -> int:
        conv = self.conv_channels * self.conv_width * dtype.size
        return conv + self.heads * self.key_dim * self.value_dim * 4


class StateCache:
    def __init__(self, shapes: list[LayerStateShape], num_slots: int, dtype: mx.Dtype) -> None:
        self.num_slots = num_slots
        self.conv = [mx.zeros((num_slots, s.conv_channels, s.conv_width), dtype=dtype) for s in shapes]
        self.recurrent = [
            mx.zeros((num_slots, s.heads, s.key_dim, s.value_dim), dtype=mx.float32) for s in shapes
        ]
        mx.eval(self.arrays())

    def copy_slots(self, copies: list[tuple[int, int]]) -> None:
        """Prefix checkpoints (engine/state_checkpoints.py): copy each (source, destination) slot, every
        layer, in order (a later copy may read an earlier one's destination); evaluated with the step."""
        for source, dest in copies:
            for a in self.arrays():
                a[dest] = a[source]

    def arrays(self) -> list[mx.array]:
        # A conv-only layer (LFM2) has an empty recurrent array: MLX's CPU kernels fault on empty scatters.
        return [a for a in (*self.conv, *self.recurrent) if a.size]


@dataclass(slots=True)
class StepRows:
    """One step's rows as the stateful layers see them."""

    decode_tokens: mx.array | None  # int32 [D]: token index of each one-token row
    decode_slots: mx.array | None  # int32 [D]
    prefills: list[tuple[int, int, int]]  # (start, end, slot) of each longer row
    fresh_slots: mx.array | None  # int32: slots zeroed before the step (rows starting at position 0)
    # (start, end, slot, spec row per token or -1) of each verify row: not in `prefills`
    verify: list[tuple[int, int, int, list[int]]] = field(default_factory=list)

    def verify_tokens(self) -> Iterator[tuple[int, int, int]]:
        """(token, slot, spec row or -1) of every verify row's tokens, in order."""
        for start, end, slot, keep in self.verify:
            for t in range(start, end):
                yield t, slot, keep[t - start]

    @classmethod
    def from_batch(
        cls,
        slots: np.ndarray,
        query_start_loc: np.ndarray,
        positions: np.ndarray,
        keep: np.ndarray | None = None,
    ) -> StepRows:
        lens = np.diff(query_start_loc)
        starts = query_start_loc[:-1]
        one = np.flatnonzero(lens == 1)
        longer = np.flatnonzero(lens > 1)
        verifying = longer[keep[starts[longer]] >= 0] if keep is not None and len(longer) else longer[:0]
        fresh = slots[positions[starts] == 0] if len(starts) else slots[:0]

        def ints(values: np.ndarray) -> mx.array:
            return mx.array(np.ascontiguousarray(values, dtype=np.int32))

        return cls(
            decode_tokens=ints(starts[one]) if one.size else None,
            decode_slots=ints(slots[one]) if one.size else None,
            prefills=[
                (int(starts[r]), int(starts[r] + lens[r]), int(slots[r]))
                for r in longer
                if r not in verifying
            ],
            fresh_slots=ints(fresh) if fresh.size else None,
            verify=[
                (
                    int(starts[r]),
                    int(starts[r] + lens[r]),
                    int(slots[r]),
                    keep[starts[r] : starts[r] + lens[r]].tolist(),
                )
                for r in verifying
                if keep is not None
            ],
        )

    def reset(self, cache: StateCache) -> None:
        """Zero the slots of rows that start a sequence (a new request, or one recomputed after preemption)."""
        if self.fresh_slots is None:
            return
        for a in cache.arrays():
            a[self.fresh_slots] = mx.zeros((self.fresh_slots.size, *a.shape[1:]), dtype=a.dtype)
