"""`--speculative mtp`: the checkpoint's own multi-token-prediction head (mtp_head.py) proposes k draft
tokens per speculating sequence, driven by the EAGLE-3 proposer's machinery (eagle3_proposer.py: the
head's per-request K/V, the target rows filed per step, rows of rejected drafts dropped, greedy drafts).

The head reads the target's last hidden state of every row the target computed (prompt chunks and each
position of a verify row). While it is attached the runner hands the model's step to `LastHidden`, which
runs the model's own layer loop unchanged (the hybrid loop of models/qwen3_next.py included) and files
its output rows before the final norm; nothing else changes, and without the head the runner never
calls it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import torch

from localchat.backends.torch.eagle3_proposer import Eagle3Proposer, HiddenTaps
from localchat.backends.torch.kv_cache import KVCache
from localchat.backends.torch.models.base import DecoderLM, StepMetadata
from localchat.backends.torch.mtp_head import MtpHead, MtpLoadError
from localchat.engine.interface import BatchInputs
from localchat.weights.tensors import WeightTensor

if TYPE_CHECKING:
    from localchat.backends.torch.runner import TorchRunner

# Model types whose checkpoints may carry the head this module runs (Qwen3.5 dense / MoE, Qwen3-Next).
# GLM-4.5's nextn layers too (mtp_head.py `NEXTN_MODEL_TYPES`).
MTP_MODEL_TYPES = frozenset({"qwen3_5_text", "qwen3_5_moe_text", "qwen3_next", "glm4_moe"})


class LastHidden(HiddenTaps):
    """The model's own step, its output rows (the last hidden states, before the final norm) filed."""

    def __init__(self, sink: Callable[[BatchInputs, torch.Tensor], None]) -> None:
        super().__init__([], sink)

    def hidden_states(
        self,
        model: DecoderLM,
        batch: BatchInputs,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: StepMetadata,
        kv_caches: list[KVCache],
    ) -> torch.Tensor:
        x = model.hidden_states(input_ids, positions, meta, kv_caches)
        self.layer_steps += 1
        self.sink(batch, x)
        return x


def attach_mtp(
    runner: TorchRunner, weights: Iterable[WeightTensor], target_name: str, token_limit: int
) -> Eagle3Proposer:
    """Load the MTP head from `weights` (the checkpoint's tensors; only `mtp.*` are read), and have the
    runner file its last hidden states from now on. MtpLoadError when the model has no such head."""
    config = runner.config
    if config.model_type not in MTP_MODEL_TYPES:
        raise MtpLoadError(
            f"--speculative mtp: {target_name} ({config.model_type}) has no multi-token-prediction head "
            "this app runs (Qwen3.5, Qwen3-Next and GLM-4.5 checkpoints carry one). Use --speculative ngram "
            "or draft."
        )
    if getattr(runner, "steps_in_flight", 1) != 1:
        raise MtpLoadError(
            "--speculative mtp with steps in flight (--pp): the head needs each step's rows first"
        )
    head = MtpHead.load(runner.model, weights, runner.device, runner.dtype, runner.quant)
    proposer = Eagle3Proposer(head, runner.model, token_limit)
    runner.hidden_taps = LastHidden(proposer.file_step)
    return proposer
