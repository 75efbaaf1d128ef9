"""Prefill a prompt with one picture through a torch runner as the engine would: chunks cut where the
scheduler cuts them for models that see pictures both ways (never inside the picture's run), each step's
BatchInputs carrying the picture's slice, so the runner encodes it and builds the picture masks."""

from __future__ import annotations

import numpy as np

from localchat.backends.torch.runner import TorchRunner
from localchat.engine.interface import ImageSlice
from localchat.engine.request import ImageInput
from localchat.vision.picture_runs import whole_picture_end
from localchat.vision.placement import chunk_rows
from tests.helpers.torch_batch import PagedDriver


def scheduler_chunks(prompt_len: int, image: ImageInput, chunk: int | None) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = []
    start = 0
    while start < prompt_len:
        end = prompt_len if chunk is None else min(start + chunk, prompt_len)
        end = whole_picture_end([image], start, end)
        spans.append((start, end))
        start = end
    return spans


def prefill_logits(
    runner: TorchRunner, driver: PagedDriver, req_id: str, image: ImageInput, spans: list[tuple[int, int]]
) -> np.ndarray:
    """Every prompt token's logits [prompt_len, vocab], the prompt run in the given [start, end) steps."""
    rows_logits = []
    for start, end in spans:
        out, batch = driver.build({req_id: end - start}, every_token=True)
        rows, picked = chunk_rows(list(image.placeholders), start, end)
        if rows:
            batch.image_slices = [ImageSlice(image, rows, picked)]
        rows_logits.append(runner.compute_logits(out, batch).cpu().numpy())
    return np.concatenate(rows_logits)
