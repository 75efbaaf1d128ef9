"""A picture's token runs, for models whose language model attends over each run both ways (Gemma 3; Gemma 4
with `use_bidirectional_attention: "vision"`): chunked prefill must not cut such a run, since the rows
before the cut could not see the keys after it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from localchat.engine.interface import BatchInputs
from localchat.engine.request import ImageInput


def picture_runs(placeholders: Sequence[int]) -> list[tuple[int, int]]:
    """Maximal runs of consecutive placeholder positions, as [start, end) pairs (transformers' blocks:
    consecutive image tokens)."""
    runs: list[tuple[int, int]] = []
    for pos in sorted(placeholders):
        if runs and runs[-1][1] == pos:
            runs[-1] = (runs[-1][0], pos + 1)
        else:
            runs.append((pos, pos + 1))
    return runs


def whole_picture_end(images: Iterable[ImageInput], start: int, end: int) -> int:
    """The end of a prefill chunk [start, end) moved off any picture run it would cut: back to the run's
    start when the chunk begins before the run, else on to the run's end (the step takes the whole run)."""
    for image in images:
        for run_start, run_end in picture_runs(image.placeholders):
            if run_start < end < run_end:
                return run_start if run_start > start else run_end
    return end


def picture_mask(batch: BatchInputs, start: int, end: int, seq_len: int) -> np.ndarray | None:
    """For the prefill row of flat tokens [start, end) with `seq_len` keys: bool [end - start, seq_len], True
    where query and key are in one picture's run (the backends OR it into the causal mask); None when the
    row holds no picture token."""
    images = [s.image for s in batch.image_slices if start <= s.token_rows[0] < end]
    if not images:
        return None
    key_run = np.full(seq_len, -1, dtype=np.int64)  # which run each key position is in
    run_id = 0
    for image in images:
        for run_start, run_end in picture_runs(image.placeholders):
            key_run[run_start : min(run_end, seq_len)] = run_id
            run_id += 1
    query_run = key_run[batch.positions[start:end]]
    return (query_run[:, None] == key_run[None, :]) & (query_run[:, None] >= 0)
