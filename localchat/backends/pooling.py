"""Embedding requests, for every runner: the final-normed hidden state of each prompt token, summed
across prefill chunks, then mean-pooled and L2-normalised (llama.cpp's default for decoder models).

Backend-neutral: a runner passes `token_sum`, which takes one request's slice of this step's hidden
states (pre-norm, any array type) and returns the sum of its final-normed rows as float32 numpy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from localchat.engine.interface import BatchInputs


class Pooler:
    def __init__(self, token_sum: Callable[[Any], np.ndarray]) -> None:
        self.token_sum = token_sum
        self.sums: dict[str, np.ndarray] = {}  # req_id -> float64 [hidden], tokens pooled so far
        self.counts: dict[str, int] = {}

    def start(self, req_id: str) -> None:
        self.sums.pop(req_id, None)
        self.counts[req_id] = 0

    def forget(self, req_id: str) -> None:
        self.sums.pop(req_id, None)
        self.counts.pop(req_id, None)

    def rows(self, batch: BatchInputs) -> list[int]:
        return [i for i, r in enumerate(batch.req_ids) if r in self.counts] if self.counts else []

    def add(self, batch: BatchInputs, hidden: Any, rows: list[int]) -> None:
        """hidden [num_tokens, hidden] (pre-norm): add each pooled row's tokens of this step."""
        qsl = batch.query_start_loc
        for row in rows:
            req_id, start, end = batch.req_ids[row], int(qsl[row]), int(qsl[row + 1])
            total = self.token_sum(hidden[start:end]).astype(np.float64)
            self.sums[req_id] = self.sums[req_id] + total if req_id in self.sums else total
            self.counts[req_id] += end - start

    def finish(self, req_ids: list[str]) -> dict[str, list[float]]:
        """The pooled vectors of those of `req_ids` being pooled (their prompt ended this step)."""
        out = {}
        for req_id in req_ids:
            if req_id in self.counts:
                mean = self.sums[req_id] / self.counts[req_id]
                out[req_id] = (mean / max(float(np.linalg.norm(mean)), 1e-12)).tolist()
                self.forget(req_id)
        return out
