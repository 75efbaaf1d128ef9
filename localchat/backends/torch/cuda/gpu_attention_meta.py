"""The Triton attention kernels' per-step inputs (no Triton import: CPU-only installs load this too).

Tile sizes live here because the host side decides the launch grid: prefill rows are cut into
`BLOCK_M`-query tiles, and decode contexts into splits of whole `BLOCK_N`-key steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from localchat.engine.interface import BatchInputs

BLOCK_N = 64  # keys per inner-loop step
BLOCK_M = 32  # queries per prefill tile
MAX_SPLITS = 16


def pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def pick_num_splits(num_rows: int, kv_heads: int, max_seq_len: int, num_sms: int) -> int:
    """Enough (row, KV head, split) programs to fill the GPU twice over, never a split under BLOCK_N keys."""
    programs = max(1, num_rows * kv_heads)
    want = pow2(max(1, -(-2 * num_sms // programs)))
    most = pow2(max(1, -(-max_seq_len // BLOCK_N)))
    return max(1, min(want, most, MAX_SPLITS))


@dataclass(slots=True)
class TritonAttentionMetadata:
    """Per-step device tensors for the Triton kernels, built once per step (or kept by a CUDA graph)."""

    slot_mapping: torch.Tensor  # int64 [T]
    block_tables: torch.Tensor  # int32 [R, max_blocks]
    seq_lens: torch.Tensor  # int32 [R]
    positions: torch.Tensor  # int32 [T]
    query_start_loc: torch.Tensor  # int32 [R + 1]
    block_size: int
    dec_tokens: torch.Tensor | None  # int32 [D]: token index of each decode row
    dec_rows: torch.Tensor | None  # int32 [D]: its batch row (block table / seq_lens index)
    tile_rows: torch.Tensor | None  # int32 [tiles]: prefill tiles' batch rows
    tile_starts: torch.Tensor | None  # int32 [tiles]: their first token index
    num_splits: int
    tokens_per_split: int

    @classmethod
    def from_batch(
        cls, batch: BatchInputs, device: torch.device, kv_heads: int, num_sms: int = 132
    ) -> TritonAttentionMetadata:
        qsl = batch.query_start_loc.astype(np.int64)
        q_lens = np.diff(qsl)
        decode = np.flatnonzero(q_lens == 1)
        tile_rows: list[int] = []
        tile_starts: list[int] = []
        for row in np.flatnonzero(q_lens > 1):
            for start in range(int(qsl[row]), int(qsl[row + 1]), BLOCK_M):
                tile_rows.append(int(row))
                tile_starts.append(start)
        max_seq = int(batch.seq_lens[decode].max()) if decode.size else 1
        splits = pick_num_splits(len(decode), kv_heads, max_seq, num_sms)
        per_split = -(-max_seq // splits)

        def dev(values: np.ndarray | list[int], dtype: torch.dtype = torch.int32) -> torch.Tensor:
            array = np.ascontiguousarray(values, dtype=np.int64 if dtype == torch.int64 else np.int32)
            return torch.from_numpy(array).to(device, non_blocking=True)

        return cls(
            slot_mapping=dev(batch.slot_mapping, torch.int64),
            block_tables=dev(batch.block_tables),
            seq_lens=dev(batch.seq_lens),
            positions=dev(batch.positions),
            query_start_loc=dev(qsl),
            block_size=batch.block_size,
            dec_tokens=dev(qsl[decode]) if decode.size else None,
            dec_rows=dev(decode) if decode.size else None,
            tile_rows=dev(tile_rows) if tile_rows else None,
            tile_starts=dev(tile_starts) if tile_starts else None,
            num_splits=splits,
            tokens_per_split=-(-per_split // BLOCK_N) * BLOCK_N,
        )
