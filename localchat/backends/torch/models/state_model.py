"""The state-slot plumbing shared by hybrid models whose non-attention layers keep a fixed state per
sequence (LFM2's short conv, Mamba-2): the spec the engine sizes its pool by, the pool itself, and the
per-step binding of rows to slots (state_cache.py). A subclass lists its layers' `LayerStateShape`s.
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np
import torch

from localchat.backends.torch.models.base import DecoderLM
from localchat.backends.torch.state_cache import LayerStateShape, StateCache, StepRows, Zeros
from localchat.engine.interface import StateCacheSpec
from localchat.weights.config import ModelConfig


def _device_zeros(device: torch.device, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype, device=device)


class StateModel(DecoderLM):
    capturable = False  # the state slots are gathered per step: no fixed-address decode graph

    def __init__(self, config: ModelConfig, device: torch.device) -> None:
        super().__init__(config, device)
        self.states: StateCache | None = None
        self.rows: StepRows | None = None

    def state_shapes(self) -> list[LayerStateShape]:
        raise NotImplementedError

    def decode_plan(self) -> None:
        return None  # the fused C decode step knows only transformer layers

    def state_cache_spec(self, dtype: torch.dtype) -> StateCacheSpec | None:
        shapes = self.state_shapes()
        if not shapes:
            return None
        return StateCacheSpec(len(shapes), sum(s.bytes_per_slot(dtype) for s in shapes))

    def initialize_state_cache(self, num_slots: int, dtype: torch.dtype, zeros: Zeros) -> None:
        device = self.norm.device

        def zeros_or_empty(shape: tuple[int, ...], kind: torch.dtype) -> torch.Tensor:
            # A conv-only layer (LFM2) has no recurrent matrix: an empty tensor, which no mapping can back.
            return zeros(shape, kind) if math.prod(shape) else torch.zeros(shape, dtype=kind, device=device)

        self.states = StateCache(self.state_shapes(), num_slots, dtype, zeros_or_empty)

    def begin_step(
        self,
        slots: np.ndarray | None,
        query_start_loc: np.ndarray,
        positions: np.ndarray,
        device: torch.device,
        keep: np.ndarray | None = None,
    ) -> None:
        """Bind this step's rows to their state slots. Without slots (the runner's warm-up forward) each
        row gets a scratch slot of its own. `keep`: BatchInputs.state_keep (speculative verify rows)."""
        if slots is None:
            slots = np.arange(len(query_start_loc) - 1, dtype=np.int64)
            if self.states is None or self.states.num_slots < len(slots):
                self.states = StateCache(
                    self.state_shapes(), len(slots), self.norm.dtype, partial(_device_zeros, device)
                )
        self.rows = StepRows.from_batch(slots, query_start_loc, positions, device, keep)
        assert self.states is not None
        self.rows.reset(self.states)

    def bound(self) -> tuple[StepRows, StateCache]:
        assert self.rows is not None and self.states is not None, "begin_step binds the state slots"
        return self.rows, self.states
