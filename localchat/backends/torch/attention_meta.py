"""What every attention variant of the torch backend shares: the CPU path's per-step metadata
(`AttentionMetadata`), a layer's `AttentionOptions`, and the KV cache writes and reads. attention.py
dispatches among the variants (triton_attention.py, windowed_attention.py), which import this module,
not the dispatcher."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from localchat.backends.torch.cpu import kernels as cpu_kernels
from localchat.backends.torch.kernel_choice import cpu_decode_kernels
from localchat.backends.torch.kv_cache import Int8KVCache, KVCache, gather_int8, write_int8
from localchat.engine.interface import BatchInputs


@dataclass(frozen=True, slots=True)
class AttentionOptions:
    """How one layer attends, where it differs from plain causal softmax(q k / sqrt(d)) v."""

    window: int | None = None  # sliding window: the last `window` positions, the query's own included
    softcap: float | None = None  # scores -> softcap * tanh(scores / softcap), before masking
    scale: float | None = None  # score scale; None: 1 / sqrt(head_dim)
    # gpt-oss: one learned logit per query head [heads], an extra softmax column that takes no value
    sinks: torch.Tensor | None = None
    # Gemma 3 (all layers), Gemma 4 "vision" (sliding layers): a picture's tokens see its whole run
    # (picture_attention.py), where the step's prefill rows carry a `picture_mask`
    pictures_both_ways: bool = False

    def matter(self, max_seq_len: int) -> bool:
        """False when plain causal attention computes the same (a window longer than every context)."""
        short = self.window is None or self.window >= max_seq_len
        return not (short and self.softcap is None and self.scale is None and self.sinks is None)


@dataclass(slots=True)
class PrefillRow:
    start: int  # first token index of the row in the flat batch
    end: int
    block_ids: torch.Tensor | None  # int64 [ceil(seq_len / block_size)]; None: context == new tokens
    seq_len: int
    mask: torch.Tensor | None  # bool [q_len, seq_len], True = attend; None: plain causal
    # With the CPU kernels: the row's block table (int64 [blocks]), and once a layer takes the kernel
    # path, that table per query [q_len, blocks] and each query's context length [q_len] (`per_query`)
    table: torch.Tensor | None = None
    per_query: tuple[torch.Tensor, torch.Tensor] | None = None
    # Steps with pictures, for models that attend over them both ways: bool [q_len, seq_len], True where
    # query and key are in one picture's run (picture_attention.py); None otherwise
    picture_mask: torch.Tensor | None = None


@dataclass(slots=True)
class AttentionMetadata:
    """Per-step tensors shared by every layer, built once from `BatchInputs`."""

    slot_mapping: torch.Tensor  # int64 [num_tokens]
    block_size: int
    decode_token_idx: torch.Tensor | None  # int64 [D]; None when every token is a decode row
    decode_block_tables: torch.Tensor | None  # int64 [D * max_blocks], row-major
    decode_bias: torch.Tensor | None  # float32 [kv_heads * D, 1, max_blocks * block_size]; None if D == 1
    decode_len: int  # D == 1: the row's context length (no padding to mask, just a slice)
    decode_span: int | None  # D == 1 with consecutive block ids: first slot of a gather-free slice
    prefills: list[PrefillRow]
    decode_seq_lens: np.ndarray | None = None  # int [D]: each decode row's context length
    # Decode score biases for windowed layers, built on first use per window (see `window_bias`).
    window_biases: dict[int | None, torch.Tensor] = field(default_factory=dict)
    max_seq_len: int = 0  # the longest context of the step
    decode_lens64: torch.Tensor | None = None  # int64 [D], for the fused CPU kernel
    cpu_kernels: cpu_kernels.Kernels | None = None  # set on CPU when the compiled kernels are loaded

    @classmethod
    def from_batch(cls, batch: BatchInputs, device: torch.device, kv_heads: int) -> AttentionMetadata:
        if batch.num_tokens == 1 and len(batch.req_ids) == 1:
            return cls._one_decode(batch, device)
        return cls._rows(batch, device, kv_heads)

    @classmethod
    def _rows(cls, batch: BatchInputs, device: torch.device, kv_heads: int) -> AttentionMetadata:
        bs = batch.block_size
        qsl = batch.query_start_loc
        q_lens = np.diff(qsl)
        seq_lens = batch.seq_lens
        slot_mapping = torch.from_numpy(np.ascontiguousarray(batch.slot_mapping, dtype=np.int64)).to(device)
        decode_rows = np.flatnonzero(q_lens == 1)
        decode_idx = bt = bias = span = lens = None
        ops = cpu_decode_kernels(device)
        decode_len = 0
        if decode_rows.size:
            num_blocks = -(-int(seq_lens[decode_rows].max()) // bs)
            tables = np.ascontiguousarray(batch.block_tables[decode_rows, :num_blocks], dtype=np.int64)
            bt = torch.from_numpy(tables.reshape(-1)).to(device)
            lens = torch.from_numpy(seq_lens[decode_rows].astype(np.int64)).to(device)
            if decode_rows.size == 1:
                # Single stream: slice to the exact length (no mask); read in place if blocks are consecutive.
                decode_len = int(seq_lens[decode_rows[0]])
                if (np.diff(tables[0]) == 1).all():
                    span = int(tables[0, 0]) * bs
            else:
                allowed = np.arange(num_blocks * bs)[None, :] < seq_lens[decode_rows, None]  # [D, S]
                row_bias = np.where(allowed, np.float32(0), np.float32(-np.inf))[:, None, :]
                # One bias row per (kv head, row) pair, the order of the batched matmuls' batch dim.
                bias = torch.from_numpy(np.tile(row_bias, (kv_heads, 1, 1))).to(device)
            if decode_rows.size != batch.num_tokens:
                decode_idx = torch.from_numpy(qsl[decode_rows].astype(np.int64)).to(device)
        prefills = []
        for row in np.flatnonzero(q_lens > 1):
            start, end, seq_len = int(qsl[row]), int(qsl[row + 1]), int(seq_lens[row])
            ids = torch.from_numpy(batch.block_tables[row, : -(-seq_len // bs)].astype(np.int64)).to(device)
            table = ids if ops is not None else None  # the decode kernel reads prefill rows by it too
            if seq_len == end - start:  # nothing cached: the new tokens are the whole context
                prefills.append(PrefillRow(start, end, None, seq_len, None, table))
                continue
            # Query at position p sees every cached/new key at positions <= p.
            q_pos = torch.from_numpy(batch.positions[start:end].astype(np.int64)).to(device)
            row_mask = torch.arange(seq_len, device=device)[None, :] <= q_pos[:, None]
            prefills.append(PrefillRow(start, end, ids, seq_len, row_mask, table))
        dec_lens = seq_lens[decode_rows] if decode_rows.size else None
        max_len = int(seq_lens.max()) if seq_lens.size else 0
        return cls(
            slot_mapping, bs, decode_idx, bt, bias, decode_len, span, prefills, dec_lens, {}, max_len, lens, ops,
        )  # fmt: skip

    @classmethod
    def _one_decode(cls, batch: BatchInputs, device: torch.device) -> AttentionMetadata:
        """`from_batch` for a step of one decode token (one stream: the common step), the same tensors
        with a third of the numpy calls (it runs every token, on caches the weights just swept, #34)."""
        bs = batch.block_size
        seq_len = int(batch.seq_lens[0])
        tables = batch.block_tables[0, : -(-seq_len // bs)].astype(np.int64)
        span = int(tables[0]) * bs if (tables[1:] == tables[:-1] + 1).all() else None
        slot_mapping = torch.from_numpy(np.ascontiguousarray(batch.slot_mapping, dtype=np.int64)).to(device)
        lens = torch.from_numpy(np.array([seq_len], dtype=np.int64)).to(device)
        return cls(
            slot_mapping, bs, None, torch.from_numpy(tables).to(device), None, seq_len, span, [],
            batch.seq_lens[:1], {}, seq_len, lens, cpu_decode_kernels(device),
        )  # fmt: skip

    def window_bias(self, window: int | None, kv_heads: int, span: int) -> torch.Tensor:
        """Additive decode bias [kv_heads * D, 1, span]: 0 where a row's query sees the key, else -inf."""
        bias = self.window_biases.get(window)
        if bias is None:
            assert self.decode_seq_lens is not None
            lens = self.decode_seq_lens[:, None]
            pos = np.arange(span)[None, :]
            allowed = (pos < lens) & ((pos >= lens - window) if window else True)  # query at lens - 1
            row_bias = np.where(allowed, np.float32(0), np.float32(-np.inf))[:, None, :]
            device = self.slot_mapping.device
            bias = torch.from_numpy(np.tile(row_bias, (kv_heads, 1, 1))).to(device)
            self.window_biases[window] = bias
        return bias


def write_kv(k: torch.Tensor, v: torch.Tensor, cache: KVCache, slots: torch.Tensor) -> None:
    """Store this step's keys/values ([tokens, kv_heads, head_dim]) at their slots."""
    if isinstance(cache, Int8KVCache):
        write_int8(k, v, cache, slots)
        return
    # .to: a bf16 cache under float32 compute (--kv-cache-dtype bf16); a no-op otherwise.
    cache[0].index_copy_(1, slots, k.transpose(0, 1).to(cache.dtype))
    cache[1].index_copy_(1, slots, v.transpose(0, 1).to(cache.dtype))


def gather_blocks(cache: KVCache, block_ids: torch.Tensor, block_size: int) -> torch.Tensor:
    """[2, kv_heads, num_slots, d] -> [2, kv_heads, len(block_ids) * block_size, d], blocks in order
    (an int8 cache comes back dequantized to float32)."""
    if isinstance(cache, Int8KVCache):
        return gather_int8(cache, block_ids, block_size)
    two, kv_heads, slots, head_dim = cache.shape
    blocks = cache.view(two, kv_heads, slots // block_size, block_size * head_dim)
    return blocks.index_select(2, block_ids).view(two, kv_heads, -1, head_dim)


def row_keys_values(
    k: torch.Tensor, v: torch.Tensor, cache: KVCache, row: PrefillRow, block_size: int, heads: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A prefill row's whole context as keys and values [heads, S, d], one copy per query head."""
    if row.block_ids is None:
        keys = k[row.start : row.end].transpose(0, 1)  # [kvh, L, d]
        values = v[row.start : row.end].transpose(0, 1)
    else:
        kv = gather_blocks(cache, row.block_ids, block_size)[:, :, : row.seq_len]  # [2, kvh, S, d]
        kv = kv.to(k.dtype)  # an int8 cache gathers to float32, a bf16 one may differ from the compute dtype
        keys, values = kv[0], kv[1]
    group = heads // k.shape[1]
    if group > 1:
        keys = keys.repeat_interleave(group, dim=0)  # [heads, S, d]: head i reads KV head i // group
        values = values.repeat_interleave(group, dim=0)
    return keys, values
