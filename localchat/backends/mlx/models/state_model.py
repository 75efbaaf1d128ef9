"""The state-slot plumbing shared by MLX hybrid models whose non-attention layers keep a fixed state per
sequence (LFM2's short conv): the spec the engine sizes its pool by, the pool, and the per-step binding
of rows to slots (localchat/backends/mlx/state_cache.py). A subclass lists its layers' shapes.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from localchat.backends.mlx.models.base import DecoderLM
from localchat.backends.mlx.state_cache import LayerStateShape, StateCache, StepRows
from localchat.engine.interface import StateCacheSpec


class StateModel(DecoderLM):
    states: StateCache | None = None
    rows: StepRows | None = None

    def state_shapes(self) -> list[LayerStateShape]:
        raise NotImplementedError

    def state_cache_spec(self, dtype: mx.Dtype) -> StateCacheSpec | None:
        shapes = self.state_shapes()
        if not shapes:
            return None
        return StateCacheSpec(len(shapes), sum(s.bytes_per_slot(dtype) for s in shapes))

    def initialize_state_cache(self, num_slots: int, dtype: mx.Dtype) -> None:
        self.states = None  # drop the old pool first: its memory is reused
        self.states = StateCache(self.state_shapes(), num_slots, dtype)

    def state_arrays(self) -> list[mx.array]:
        return self.states.arrays() if self.states is not None else []

    def begin_step(
        self,
        slots: np.ndarray | None,
        query_start_loc: np.ndarray,
        positions: np.ndarray,
        dtype: mx.Dtype,
        keep: np.ndarray | None = None,
    ) -> None:
        """Bind this step's rows to their state slots. Without slots (a step outside the engine) each row
        gets a scratch slot of its own. `keep`: BatchInputs.state_keep (speculative verify rows)."""
        if slots is None:
            slots = np.arange(len(query_start_loc) - 1, dtype=np.int64)
            if self.states is None or self.states.num_slots < len(slots):
                self.states = StateCache(self.state_shapes(), len(slots), dtype)
        self.rows = StepRows.from_batch(slots, query_start_loc, positions, keep)
        assert self.states is not None
        self.rows.reset(self.states)

    def bound(self) -> tuple[StepRows, StateCache]:
        assert self.rows is not None and self.states is not None, "begin_step binds the state slots"
        return self.rows, self.states
