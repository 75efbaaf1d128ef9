"""Prefill masks for models whose language model attends over each picture's tokens both ways (Gemma 3 on
every layer; Gemma 4 with `use_bidirectional_attention: "vision"` on its sliding layers): a query in a
picture's run also sees the later keys of that run, as transformers' blockwise mask lets it. The scheduler
never cuts such a run across chunks (engine/scheduler.py), so those keys are in the step. Only steps whose
rows hold picture tokens pay for it: their layers with `AttentionOptions.pictures_both_ways` take the
masked SDPA path instead of the causal one; decode rows never change."""

from __future__ import annotations

import torch

from localchat.backends.torch.attention_meta import AttentionMetadata, PrefillRow
from localchat.engine.interface import BatchInputs
from localchat.vision.picture_runs import picture_mask


def add_picture_masks(meta: AttentionMetadata, batch: BatchInputs) -> None:
    """Set each prefill row's `picture_mask` (bool [q_len, seq_len]: query and key in one picture run)."""
    for row in meta.prefills:
        mask = picture_mask(batch, row.start, row.end, row.seq_len)
        if mask is not None:
            row.picture_mask = torch.from_numpy(mask).to(meta.slot_mapping.device)


def causal_mask(row: PrefillRow, device: torch.device) -> torch.Tensor:
    """bool [q_len, seq_len]: the row's queries are its last positions; each sees the keys up to its own."""
    q_len = row.end - row.start
    q_pos = torch.arange(row.seq_len - q_len, row.seq_len, device=device)[:, None]
    return torch.arange(row.seq_len, device=device)[None, :] <= q_pos
