"""Paged attention over a block-table KV cache, in plain PyTorch (SDPA over gathered blocks).

Cache layout, per layer: K and V are `[num_blocks, block_size, num_kv_heads, head_dim]`; token slot
`s = block_id * block_size + offset` is row `s` of the flattened `[num_blocks * block_size, kv_heads,
head_dim]` view. Each step first writes every new K/V at `slot_mapping`, then attends, because a
request may read blocks that another request of the same batch writes this step (shared prefix).

Rows with one query token (decode, or a one-token prefill chunk) go through one batched SDPA with a
padding mask; rows with several query tokens (prefill, chunked prefill) are attended one by one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from localchat.engine.interface import BatchInputs


@dataclass(slots=True)
class PrefillRow:
    start: int  # first token index of the row in the flat batch
    end: int
    block_ids: torch.Tensor | None  # int64 [ceil(seq_len / block_size)]; None: context == new tokens
    seq_len: int
    mask: torch.Tensor | None  # bool [q_len, seq_len], True = attend; None: plain causal


@dataclass(slots=True)
class AttentionMetadata:
    """Per-step tensors shared by every layer, built once from `BatchInputs`."""

    slot_mapping: torch.Tensor  # int64 [num_tokens]
    decode_token_idx: torch.Tensor | None  # int64 [D]; None when every token is a decode row
    decode_block_tables: torch.Tensor | None  # int64 [D, max_blocks]
    decode_mask: torch.Tensor | None  # [D, 1, 1, max_blocks * block_size] additive (0 / -inf); None if D == 1
    decode_len: int  # D == 1: the row's context length (no padding to mask, just a slice)
    decode_span: int | None  # D == 1 with consecutive block ids: first slot of a gather-free slice
    prefills: list[PrefillRow]

    @classmethod
    def from_batch(cls, batch: BatchInputs, device: torch.device, dtype: torch.dtype) -> AttentionMetadata:
        bs = batch.block_size
        qsl = batch.query_start_loc
        q_lens = np.diff(qsl)
        seq_lens = batch.seq_lens
        slot_mapping = torch.from_numpy(np.ascontiguousarray(batch.slot_mapping, dtype=np.int64)).to(device)
        decode_rows = np.flatnonzero(q_lens == 1)
        decode_idx = bt = mask = span = None
        decode_len = 0
        if decode_rows.size:
            num_blocks = -(-int(seq_lens[decode_rows].max()) // bs)
            tables = np.ascontiguousarray(batch.block_tables[decode_rows, :num_blocks], dtype=np.int64)
            bt = torch.from_numpy(tables).to(device)
            if decode_rows.size == 1:
                # Single stream: slice to the exact length (no mask); read in place if blocks are consecutive.
                decode_len = int(seq_lens[decode_rows[0]])
                if (np.diff(tables[0]) == 1).all():
                    span = int(tables[0, 0]) * bs
            else:
                positions = torch.arange(num_blocks * bs, device=device)
                lens = torch.from_numpy(seq_lens[decode_rows].astype(np.int64)).to(device)
                allowed = positions[None, :] < lens[:, None]  # [D, S]
                mask = torch.zeros(allowed.shape, dtype=dtype, device=device)
                mask = mask.masked_fill_(~allowed, float("-inf"))[:, None, None, :]
            if decode_rows.size != batch.num_tokens:
                decode_idx = torch.from_numpy(qsl[decode_rows].astype(np.int64)).to(device)
        prefills = []
        for row in np.flatnonzero(q_lens > 1):
            start, end, seq_len = int(qsl[row]), int(qsl[row + 1]), int(seq_lens[row])
            if seq_len == end - start:  # nothing cached: the new tokens are the whole context
                prefills.append(PrefillRow(start, end, None, seq_len, None))
                continue
            num_blocks = -(-seq_len // bs)
            ids = torch.from_numpy(batch.block_tables[row, :num_blocks].astype(np.int64)).to(device)
            # Query at position p sees every cached/new key at positions <= p.
            q_pos = torch.from_numpy(batch.positions[start:end].astype(np.int64)).to(device)
            row_mask = torch.arange(seq_len, device=device)[None, :] <= q_pos[:, None]
            prefills.append(PrefillRow(start, end, ids, seq_len, row_mask))
        return cls(slot_mapping, decode_idx, bt, mask, decode_len, span, prefills)


def write_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor
) -> None:
    """Store this step's keys/values ([tokens, kv_heads, head_dim]) at their slots."""
    kv_heads, head_dim = k.shape[1], k.shape[2]
    k_cache.view(-1, kv_heads, head_dim).index_copy_(0, slots, k)
    v_cache.view(-1, kv_heads, head_dim).index_copy_(0, slots, v)


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
) -> torch.Tensor:
    """q [T, heads, d], k/v [T, kv_heads, d] (this step) -> [T, heads, d]. Writes k/v into the cache."""
    write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
    if not meta.prefills:
        return _decode(q, k_cache, v_cache, meta)
    out = torch.empty_like(q)
    if meta.decode_block_tables is not None:
        out[meta.decode_token_idx] = _decode(q[meta.decode_token_idx], k_cache, v_cache, meta)
    for row in meta.prefills:
        out[row.start : row.end] = _prefill(q, k, v, k_cache, v_cache, row)
    return out


def _decode(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata
) -> torch.Tensor:
    """One query per row, all rows at once: gather each row's blocks, mask the padding."""
    rows, heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    tables = meta.decode_block_tables
    assert tables is not None
    if meta.decode_span is not None:
        start, end = meta.decode_span, meta.decode_span + meta.decode_len
        # NOTE: copying the span first looks wasteful but is not: SDPA reads each head with a stride,
        # which is slow from a cold cache; one sequential copy then SDPA on it saves 10-25% of the step
        # (dev box: 540-2000 tokens of context). float32: the softmax weights stay unrounded for P @ V.
        keys = k_cache.view(-1, kv_heads, head_dim)[start:end].to(
            torch.float32, copy=True
        )  # [S, kv_heads, d]
        values = v_cache.view(-1, kv_heads, head_dim)[start:end].to(torch.float32, copy=True)
        q = q.float()
    else:
        # index_select copies whole blocks (much faster than advanced indexing): [D, S, kv_heads, d]
        flat = tables.flatten()
        keys = k_cache.index_select(0, flat).view(rows, -1, kv_heads, head_dim)
        values = v_cache.index_select(0, flat).view(rows, -1, kv_heads, head_dim)
        if meta.decode_mask is None:  # one row: drop the block padding instead of masking it
            keys, values = keys[:, : meta.decode_len], values[:, : meta.decode_len]
    keys = keys.view(rows, -1, kv_heads, head_dim).transpose(1, 2)  # [D, kv_heads, S, d]
    values = values.view(rows, -1, kv_heads, head_dim).transpose(1, 2)
    # Group query heads by the KV head they share: [D, kv_heads, group, d]; no K/V repeat needed.
    grouped = q.view(rows, kv_heads, heads // kv_heads, head_dim)
    out = F.scaled_dot_product_attention(grouped, keys, values, attn_mask=meta.decode_mask)
    return out.reshape(rows, heads, head_dim).to(k_cache.dtype)  # [D, heads, d]


def _prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    row: PrefillRow,
) -> torch.Tensor:
    heads, kv_heads = q.shape[1], k.shape[1]
    if row.block_ids is None:
        keys, values = k[row.start : row.end], v[row.start : row.end]  # [L, kv_heads, d]
    else:
        keys = k_cache.index_select(0, row.block_ids).flatten(0, 1)[: row.seq_len]  # [S, kv_heads, d]
        values = v_cache.index_select(0, row.block_ids).flatten(0, 1)[: row.seq_len]
    group = heads // kv_heads
    if group > 1:
        keys = keys.repeat_interleave(group, dim=1)  # [S, heads, d]: head i reads KV head i // group
        values = values.repeat_interleave(group, dim=1)
    # 4-D inputs: with 3-D ones SDPA on CPU falls back to its unfused math kernel (2-3x slower).
    out = F.scaled_dot_product_attention(
        q[None, row.start : row.end].transpose(1, 2),
        keys[None].transpose(1, 2),
        values[None].transpose(1, 2),
        attn_mask=row.mask,
        is_causal=row.mask is None,
    )  # [1, heads, L, d]
    return out[0].transpose(0, 1)
