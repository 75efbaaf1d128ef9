"""EAGLE-3 on Qwen3.5 / Qwen3-Next: their layers run in the hybrid loop of models/qwen3_next.py (DeltaNet
state slots between full-attention layers), not in the plain loop `HiddenTaps` repeats, so the loop itself
keeps the inputs of the head's layers (`Model.keep_layers`) and this tap hands them to the head with the
step's batch, prompt chunks and every position of a verify row alike."""

from __future__ import annotations

from collections.abc import Callable

import torch

from localchat.backends.torch.eagle3_proposer import HiddenTaps
from localchat.backends.torch.kv_cache import KVCache
from localchat.backends.torch.models.base import DecoderLM, StepMetadata
from localchat.backends.torch.models.qwen3_next import Model as HybridModel
from localchat.engine.interface import BatchInputs


class HybridTaps(HiddenTaps):
    """The hybrid loop's kept layer inputs (index L: its output) for every row, to `sink`."""

    def __init__(
        self, model: HybridModel, layers: list[int], sink: Callable[[BatchInputs, torch.Tensor], None]
    ) -> None:
        super().__init__(layers, sink)
        model.keep_layers = frozenset(layers)

    def hidden_states(
        self,
        model: DecoderLM,
        batch: BatchInputs,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: StepMetadata,
        kv_caches: list[KVCache],
    ) -> torch.Tensor:
        assert isinstance(model, HybridModel)
        x = model.hidden_states(input_ids, positions, meta, kv_caches)
        self.layer_steps += 1
        self.sink(batch, torch.cat([model.kept[i] for i in self.layers], dim=-1))
        model.kept.clear()
        return x
