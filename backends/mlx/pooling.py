"""Embedding requests on the MLX runner: the final-normed hidden state of every prompt token, summed
across prefill chunks, then mean-pooled and L2-normalised (same as backends/torch/pooling.py)."""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx

from localchat.engine.interface import BatchInputs


class Pooler:
    def __init__(self, final_norm: Callable[[mx.array], mx.array]) -> None:
        self.final_norm = final_norm
        self.sums: dict[str, mx.array] = {}  # req_id -> float32 [hidden], tokens pooled so far
        self.counts: dict[str, int] = {}

    def start(self, req_id: str) -> None:
        self.sums.pop(req_id, None)
        self.counts[req_id] = 0

    def forget(self, req_id: str) -> None:
        self.sums.pop(req_id, None)
        self.counts.pop(req_id, None)

    def rows(self, batch: BatchInputs) -> list[int]:
        return [i for i, r in enumerate(batch.req_ids) if r in self.counts] if self.counts else []

    def add(self, batch: BatchInputs, hidden: mx.array, rows: list[int]) -> None:
        """hidden [num_tokens, hidden] (pre-norm): add each pooled row's tokens of this step."""
        qsl = batch.query_start_loc
        for row in rows:
            req_id = batch.req_ids[row]
            tokens = self.final_norm(hidden[int(qsl[row]) : int(qsl[row + 1])]).astype(mx.float32)
            total = tokens.sum(axis=0)
            self.sums[req_id] = self.sums[req_id] + total if req_id in self.sums else total
            mx.eval(self.sums[req_id])
            self.counts[req_id] += tokens.shape[0]

    def finish(self, req_ids: list[str]) -> dict[str, list[float]]:
        out = {}
        for req_id in req_ids:
            if req_id in self.counts:
                mean = self.sums[req_id] / self.counts[req_id]
                out[req_id] = (mean / mx.maximum(mx.linalg.norm(mean), 1e-12)).tolist()
                self.forget(req_id)
        return out
