"""CUDA graphs for decode steps: captured once per batch-size bucket, replayed with persistent inputs.

A decode step of a small model on a GPU is a few hundred tiny kernels; launching them from Python costs
more than running them. Replaying a captured graph launches them all at once. Graphs need static
shapes and addresses, so each step's inputs are copied into persistent buffers sized for the largest
bucket and padded up to the smallest bucket that holds the batch. Padding rows decode a dummy token
whose K/V land in the null block 0 (never read by real rows: the kernels mask past each row's length)
and whose logits are dropped. Prefill and mixed steps, and batches above the largest bucket, run
eagerly. The bucket and padding logic here is plain numpy and tested on the CPU
(tests/backends/test_cuda_graphs.py); capture itself needs a GPU (`gpu` tests, benchmarks/gpu_check.sh).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from localchat.backends.torch.cuda.gpu_attention_meta import BLOCK_N, TritonAttentionMetadata, pick_num_splits
from localchat.engine.interface import BatchInputs

log = logging.getLogger(__name__)

# (input_ids, positions, meta) -> logits [rows, vocab]: the model's decode forward.
DecodeForward = Callable[[torch.Tensor, torch.Tensor, TritonAttentionMetadata], torch.Tensor]


def graph_buckets(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, 16, 32, ... below max_num_seqs, then max_num_seqs itself."""
    buckets = []
    size = 1
    while size < max_num_seqs:
        buckets.append(size)
        size *= 2
    return [*buckets, max_num_seqs]


def pick_bucket(rows: int, buckets: list[int]) -> int | None:
    """The smallest bucket that holds `rows`; None when the batch is larger than every bucket."""
    return next((b for b in buckets if b >= rows), None)


def is_graphable(batch: BatchInputs) -> bool:
    """Decode-only steps that sample every row, in order: the shape a captured graph computes."""
    rows = batch.num_reqs
    return (
        batch.num_tokens == rows
        and batch.max_query_len == 1
        and len(batch.logits_indices) == rows
        and bool((batch.logits_indices == np.arange(rows)).all())
    )


@dataclass(slots=True)
class PaddedDecode:
    """One decode step padded to a bucket: what is copied into the persistent buffers."""

    input_ids: np.ndarray  # int64 [bucket]
    positions: np.ndarray  # int32 [bucket]
    slot_mapping: np.ndarray  # int64 [bucket]; padding rows write slot 0 (the null block)
    seq_lens: np.ndarray  # int32 [bucket]; padding rows attend one (ignored) key
    block_tables: np.ndarray  # int32 [bucket, max_blocks]


def pad_decode_batch(batch: BatchInputs, bucket: int, max_blocks: int) -> PaddedDecode:
    rows = batch.num_reqs
    assert rows <= bucket and batch.block_tables.shape[1] <= max_blocks
    tables = np.zeros((bucket, max_blocks), dtype=np.int32)
    tables[:rows, : batch.block_tables.shape[1]] = batch.block_tables

    def padded(values: np.ndarray, dtype: type, fill: int) -> np.ndarray:
        out: np.ndarray = np.full(bucket, fill, dtype=dtype)
        out[:rows] = values
        return out

    return PaddedDecode(
        input_ids=padded(batch.input_ids, np.int64, 0),
        positions=padded(batch.positions, np.int32, 0),
        slot_mapping=padded(batch.slot_mapping, np.int64, 0),
        seq_lens=padded(batch.seq_lens, np.int32, 1),
        block_tables=tables,
    )


class DecodeBuffers:
    """Persistent device inputs for the largest bucket; bucket b uses the first b rows of each."""

    def __init__(self, max_rows: int, max_blocks: int, block_size: int, device: torch.device) -> None:
        self.max_blocks, self.block_size = max_blocks, block_size

        def zeros(*shape: int, dtype: torch.dtype = torch.int32) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        self.input_ids = zeros(max_rows, dtype=torch.int64)
        self.positions = zeros(max_rows)
        self.slot_mapping = zeros(max_rows, dtype=torch.int64)
        self.seq_lens = torch.ones(max_rows, dtype=torch.int32, device=device)
        self.block_tables = zeros(max_rows, max_blocks)
        self.rows = torch.arange(max_rows, dtype=torch.int32, device=device)  # dec_tokens == dec_rows
        self.query_start_loc = torch.arange(max_rows + 1, dtype=torch.int32, device=device)

    def metadata(self, bucket: int, kv_heads: int, max_seq_len: int, num_sms: int) -> TritonAttentionMetadata:
        """Views of the buffers for one bucket; the split count is fixed by the longest possible context."""
        splits = pick_num_splits(bucket, kv_heads, max_seq_len, num_sms)
        per_split = -(-max_seq_len // splits)
        return TritonAttentionMetadata(
            slot_mapping=self.slot_mapping[:bucket],
            block_tables=self.block_tables[:bucket],
            seq_lens=self.seq_lens[:bucket],
            positions=self.positions[:bucket],
            query_start_loc=self.query_start_loc[: bucket + 1],
            block_size=self.block_size,
            dec_tokens=self.rows[:bucket],
            dec_rows=self.rows[:bucket],
            tile_rows=None,
            tile_starts=None,
            num_splits=splits,
            tokens_per_split=-(-per_split // BLOCK_N) * BLOCK_N,
        )

    def load(self, padded: PaddedDecode) -> None:
        """Copy one step's inputs in place: the captured graphs keep reading these addresses."""
        b = len(padded.input_ids)
        self.input_ids[:b].copy_(torch.from_numpy(padded.input_ids), non_blocking=True)
        self.positions[:b].copy_(torch.from_numpy(padded.positions), non_blocking=True)
        self.slot_mapping[:b].copy_(torch.from_numpy(padded.slot_mapping), non_blocking=True)
        self.seq_lens[:b].copy_(torch.from_numpy(padded.seq_lens), non_blocking=True)
        self.block_tables[:b].copy_(torch.from_numpy(padded.block_tables), non_blocking=True)


class DecodeGraphs:
    """Captured decode graphs per bucket. With `capture=False` (the CPU twin used by tests) the same
    buffers and metadata run eagerly, so padding and buffer reuse are exercised without a GPU."""

    def __init__(
        self,
        forward: DecodeForward,
        *,
        max_num_seqs: int,
        max_seq_len: int,
        block_size: int,
        kv_heads: int,
        device: torch.device,
        capture: bool,
    ) -> None:
        self.forward = forward
        self.buckets = graph_buckets(max_num_seqs)
        self.buffers = DecodeBuffers(self.buckets[-1], -(-max_seq_len // block_size), block_size, device)
        num_sms = torch.cuda.get_device_properties(device).multi_processor_count if capture else 132
        self.metas = {b: self.buffers.metadata(b, kv_heads, max_seq_len, num_sms) for b in self.buckets}
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.steps_run = 0  # decode steps served through the buffers (tests, logs)
        if capture:
            self._capture_all(device)

    def _run(self, bucket: int) -> torch.Tensor:
        b = self.buffers
        return self.forward(b.input_ids[:bucket], b.positions[:bucket], self.metas[bucket])

    def _capture_all(self, device: torch.device) -> None:
        start = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        for bucket in reversed(self.buckets):  # largest first: smaller graphs reuse its memory pool
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):  # warm-up outside the capture (allocator, Triton autotune)
                self._run(bucket)
            torch.cuda.current_stream(device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                out = self._run(bucket)
            self.graphs[bucket] = (graph, out)
        torch.cuda.synchronize(device)
        log.info(
            "captured CUDA graphs for decode batch sizes %s in %.1fs",
            ", ".join(map(str, self.buckets)),
            time.perf_counter() - start,
        )

    def can_run(self, batch: BatchInputs) -> bool:
        return is_graphable(batch) and pick_bucket(batch.num_reqs, self.buckets) is not None

    def run(self, batch: BatchInputs) -> torch.Tensor:
        """Logits [rows, vocab] of a decode-only step (check `can_run` first)."""
        rows = batch.num_reqs
        bucket = pick_bucket(rows, self.buckets)
        assert bucket is not None
        self.buffers.load(pad_decode_batch(batch, bucket, self.buffers.max_blocks))
        self.steps_run += 1
        if bucket in self.graphs:
            graph, out = self.graphs[bucket]
            graph.replay()
        else:
            out = self._run(bucket)
        return out[:rows]
