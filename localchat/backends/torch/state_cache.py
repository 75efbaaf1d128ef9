"""The torch side of the hybrid cache: per-layer state tensors indexed by the engine's state slots.

Each linear-attention layer owns a conv window [slots, C, K - 1] (compute dtype, as its inputs) and a
recurrent state [slots, H, dk, dv] (float32: it accumulates over the whole sequence). `StepRows` tells
the layers, once per step, which slot each row uses, which rows start fresh and which are decode rows.

Speculative verify rows of a hybrid model (engine/hybrid_spec.py: the last token and k drafts) are
`StepRows.verify`: the layers run them token by token in their decode form (the numerics of plain
decoding) and copy the state after each position into the spec row `BatchInputs.state_keep` names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

# (shape, dtype) -> a zeroed tensor on the runner's device (on CPU: lazily committed pages, as the KV pool)
Zeros = Callable[[tuple[int, ...], torch.dtype], torch.Tensor]


@dataclass(frozen=True, slots=True)
class LayerStateShape:
    conv_channels: int
    conv_width: int  # K - 1 inputs kept
    heads: int
    key_dim: int
    value_dim: int

    def bytes_per_slot(self, dtype: torch.dtype) -> int:
        conv = self.conv_channels * self.conv_width * dtype.itemsize
        return conv + self.heads * self.key_dim * self.value_dim * 4


class StateCache:
    def __init__(
        self, shapes: list[LayerStateShape], num_slots: int, dtype: torch.dtype, zeros: Zeros
    ) -> None:
        self.num_slots = num_slots
        self.conv = [zeros((num_slots, s.conv_channels, s.conv_width), dtype) for s in shapes]
        self.recurrent = [zeros((num_slots, s.heads, s.key_dim, s.value_dim), torch.float32) for s in shapes]

    def copy_slots(self, copies: list[tuple[int, int]]) -> None:
        """Prefix checkpoints (engine/state_checkpoints.py): copy each (source, destination) slot, every
        layer, in order. One gather and scatter per tensor when no copy reads an earlier one's
        destination (the usual case); one by one otherwise."""
        tensors = [t for t in (*self.conv, *self.recurrent) if t.numel()]
        sources, dests = [s for s, _ in copies], [d for _, d in copies]
        if not set(sources) & set(dests) and len(set(dests)) == len(dests):
            device = tensors[0].device if tensors else None
            src = torch.tensor(sources, dtype=torch.int64, device=device)
            dst = torch.tensor(dests, dtype=torch.int64, device=device)
            for t in tensors:
                t.index_copy_(0, dst, t.index_select(0, src))
            return
        for source, dest in copies:
            for t in tensors:
                t[dest].copy_(t[source])


@dataclass(slots=True)
class StepRows:
    """One step's rows as the linear-attention layers see them."""

    decode_tokens: torch.Tensor | None  # int64 [D]: token index of each one-token row
    decode_slots: torch.Tensor | None  # int64 [D]
    prefills: list[tuple[int, int, int]]  # (start, end, slot) of each longer row
    fresh_slots: torch.Tensor | None  # int64: slots zeroed before the step (rows starting at position 0)
    # (start, end, slot, spec row per token or -1) of each verify row: not in `prefills`
    verify: list[tuple[int, int, int, list[int]]] = field(default_factory=list)
    keep: torch.Tensor | None = None  # int64 [T]: BatchInputs.state_keep when a row verifies (the C step's)

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
        device: torch.device,
        keep: np.ndarray | None = None,
    ) -> StepRows:
        lens = np.diff(query_start_loc)
        starts = query_start_loc[:-1]
        one = np.flatnonzero(lens == 1)
        longer = np.flatnonzero(lens > 1)
        checks = keep is not None and len(longer)
        verifying = longer[keep[starts[longer]] >= 0] if checks and keep is not None else longer[:0]
        fresh = slots[positions[starts] == 0] if len(starts) else slots[:0]

        def tensor(values: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(values, dtype=np.int64)).to(device)

        return cls(
            decode_tokens=tensor(starts[one]) if one.size else None,
            decode_slots=tensor(slots[one]) if one.size else None,
            prefills=[
                (int(starts[r]), int(starts[r] + lens[r]), int(slots[r]))
                for r in longer
                if r not in verifying
            ],
            fresh_slots=tensor(fresh) if fresh.size else None,
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
            keep=torch.from_numpy(np.ascontiguousarray(keep, dtype=np.int64)) if len(verifying) else None,
        )

    def reset(self, cache: StateCache) -> None:
        """Zero the slots of rows that start a sequence (a new request, or one recomputed after preemption)."""
        if self.fresh_slots is None:
            return
        for conv, rec in zip(cache.conv, cache.recurrent, strict=True):
            conv.index_fill_(0, self.fresh_slots, 0)
            rec.index_fill_(0, self.fresh_slots, 0)
