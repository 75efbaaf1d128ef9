"""Prefill masks for models whose language model attends over each picture's tokens both ways (Gemma 3 on
every layer; Gemma 4 with `use_bidirectional_attention: "vision"` on its sliding layers): a query in a
picture's run also sees the later keys of that run, as transformers' blockwise mask lets it. The scheduler
never cuts such a run across chunks (engine/scheduler.py), so those keys are in the step. Only steps whose
rows hold picture tokens pay for it: their layers with `AttentionOptions.pictures_both_ways` take the
masked SDPA path instead of the causal one; decode rows never change."""

from __future__ import annotations

import numpy as np
import torch

from localchat.backends.torch.attention_meta import AttentionMetadata, PrefillRow
from localchat.engine.interface import BatchInputs
from localchat.vision.picture_runs import picture_runs


def add_picture_masks(meta: AttentionMetadata, batch: BatchInputs) -> None:
    """Set each prefill row's `picture_mask` (bool [q_len, seq_len]: query and key in one picture run)."""
    for row in meta.prefills:
        images = [s.image for s in batch.image_slices if row.start <= s.token_rows[0] < row.end]
        if not images:
            continue
        key_run = np.full(row.seq_len, -1, dtype=np.int64)  # which run each key position is in
        run_id = 0
        for image in images:
            for start, end in picture_runs(image.placeholders):
                key_run[start : min(end, row.seq_len)] = run_id
                run_id += 1
        query_run = key_run[batch.positions[row.start : row.end]]
        mask = (query_run[:, None] == key_run[None, :]) & (query_run[:, None] >= 0)
        row.picture_mask = torch.from_numpy(mask).to(meta.slot_mapping.device)


def causal_mask(row: PrefillRow, device: torch.device) -> torch.Tensor:
    """bool [q_len, seq_len]: the row's queries are its last positions; each sees the keys up to its own."""
    q_len = row.end - row.start
    q_pos = torch.arange(row.seq_len - q_len, row.seq_len, device=device)[:, None]
    return torch.arange(row.seq_len, device=device)[None, :] <= q_pos
