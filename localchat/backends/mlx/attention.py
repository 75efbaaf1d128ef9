"""Paged attention over a block-table KV cache with MLX (`mx.fast.scaled_dot_product_attention`).

Cache layout, per layer: K and V are flat `[num_blocks * block_size, num_kv_heads, head_dim]` arrays,
the `[num_blocks, block_size, kv_heads, head_dim]` layout of the contract with its first two dims
merged (a free reshape). Token slot `s = block_id * block_size + offset` is row `s`.

MLX arrays are immutable, but `cache[slots] = new` rebinds the array object to a scatter whose input
buffer is donated when nothing else references it: the write then costs the written rows, not a copy
of the cache (measured: ~47 us for 16 rows whether the cache holds 20k or 200k slots; ~290 us at 200k
slots once a stray reference forces the copy). So nothing may keep old cache arrays alive.

Each step first writes every new K/V at `slot_mapping`, then attends (a request may read blocks that
another request of the same batch writes this step). One-query rows (decode) go through one batched
SDPA with a padding mask; rows with several query tokens (prefill, chunks) are attended one by one.

A layer may pass a sliding `window` (transformers' convention: the query at position p sees keys
p - window < k <= p) and a logit `softcap` (scores -> softcap * tanh(scores / softcap)); without them
the code path is the one above. Soft-capped scores need explicit float32 math (SDPA has no hook
between scores and softmax). Blocks out of the window stay allocated. Attention `sinks` (gpt-oss: a
learned logit per query head that joins the softmax denominator and weighs no value) go to SDPA's own
`sinks` argument.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from localchat.engine.interface import BatchInputs


@dataclass(slots=True)
class LayerCache:
    k: mx.array  # [num_slots, kv_heads, head_dim]
    v: mx.array


@dataclass(slots=True)
class PrefillRow:
    start: int  # first token index of the row in the flat batch
    end: int
    block_ids: mx.array | None  # int32 [ceil(seq_len / block_size)]; None: context == new tokens
    seq_len: int
    # Steps with pictures, for models that attend over them both ways (Gemma 3; Gemma 4 "vision"): bool
    # [q_len, seq_len], True where query and key are in one picture's run (vision/picture_runs.py)
    picture_mask: mx.array | None = None


@dataclass(slots=True)
class AttentionMetadata:
    """Per-step arrays shared by every layer, built once from `BatchInputs`."""

    slot_mapping: mx.array  # int32 [num_tokens]
    block_size: int
    decode_token_idx: mx.array | None  # int32 [D]; None when every token is a decode row
    decode_block_tables: mx.array | None  # int32 [D, max_blocks]
    decode_mask: mx.array | None  # bool [D, 1, 1, max_blocks * block_size]
    prefills: list[PrefillRow]
    # Outputs come out as [decode rows..., prefill rows...]; this gather restores token order.
    restore_order: mx.array | None
    decode_seq_lens: np.ndarray | None = None  # int [D]: each decode row's context length
    decode_span: int = 0  # keys per decode row after the block gather
    window_masks: dict[int, mx.array] = field(default_factory=dict)  # decode masks per window

    @classmethod
    def from_batch(cls, batch: BatchInputs) -> AttentionMetadata:
        bs = batch.block_size
        qsl = batch.query_start_loc
        q_lens = np.diff(qsl)
        seq_lens = batch.seq_lens
        decode_rows = np.flatnonzero(q_lens == 1)
        decode_idx = tables = mask = dec_lens = None
        span = 0
        order = [qsl[decode_rows]]
        if decode_rows.size:
            num_blocks = -(-int(seq_lens[decode_rows].max()) // bs)
            tables = mx.array(batch.block_tables[decode_rows, :num_blocks].astype(np.int32))
            allowed = np.arange(num_blocks * bs)[None, :] < seq_lens[decode_rows, None]  # [D, S]
            mask = mx.array(allowed[:, None, None, :])
            dec_lens, span = seq_lens[decode_rows], num_blocks * bs
            if decode_rows.size != batch.num_tokens:
                decode_idx = mx.array(qsl[decode_rows].astype(np.int32))
        prefills = []
        for row in np.flatnonzero(q_lens > 1):
            start, end, seq_len = int(qsl[row]), int(qsl[row + 1]), int(seq_lens[row])
            order.append(np.arange(start, end))
            ids = None
            if seq_len != end - start:  # a cached prefix: attend over the row's blocks
                ids = mx.array(batch.block_tables[row, : -(-seq_len // bs)].astype(np.int32))
            prefills.append(PrefillRow(start, end, ids, seq_len))
        flat_order = np.concatenate(order)
        restore = None
        if not np.array_equal(flat_order, np.arange(batch.num_tokens)):
            restore = mx.array(np.argsort(flat_order).astype(np.int32))
        slots = mx.array(batch.slot_mapping.astype(np.int32))
        return cls(slots, bs, decode_idx, tables, mask, prefills, restore, dec_lens, span)

    def decode_mask_for(self, window: int | None) -> mx.array | None:
        """The decode rows' mask [D, 1, 1, S], narrowed to the last `window` keys when given."""
        if window is None or window >= self.decode_span:  # the window covers every key
            return self.decode_mask
        mask = self.window_masks.get(window)
        if mask is None:
            assert self.decode_seq_lens is not None
            lens = self.decode_seq_lens[:, None]
            pos = np.arange(self.decode_span)[None, :]
            mask = mx.array(((pos < lens) & (pos >= lens - window))[:, None, None, :])
            self.window_masks[window] = mask
        return mask


def paged_attention(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    cache: LayerCache,
    meta: AttentionMetadata,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
    sinks: mx.array | None = None,
    pictures: bool = False,
) -> mx.array:
    """q [T, heads, d], k/v [T, kv_heads, d] (this step) -> [T, heads, d]. Writes k/v into the cache.
    `sinks` [heads]: per-head logits added to each softmax's denominator (not with `softcap`).
    `pictures`: the layer sees a picture's tokens both ways (OR the rows' picture masks, then the window)."""
    assert sinks is None or softcap is None, "soft-capped attention has no sink term"
    cache.k[meta.slot_mapping] = k
    cache.v[meta.slot_mapping] = v
    pieces = []
    if meta.decode_block_tables is not None:
        pieces.append(_decode(q, cache, meta, scale, window, softcap, sinks))
    pieces.extend(
        _prefill(q, k, v, cache, row, meta.block_size, scale, window, softcap, sinks, pictures)
        for row in meta.prefills
    )
    out = pieces[0] if len(pieces) == 1 else mx.concatenate(pieces)
    return out if meta.restore_order is None else out[meta.restore_order]


def _gather(cache_part: mx.array, block_ids: mx.array, block_size: int) -> mx.array:
    """[num_slots, kv_heads, d] gathered by block ids [..., n] -> [..., n * block_size, kv_heads, d]."""
    slots, kv_heads, head_dim = cache_part.shape
    blocks = cache_part.reshape(slots // block_size, block_size, kv_heads, head_dim)[block_ids]
    return blocks.reshape(*block_ids.shape[:-1], -1, kv_heads, head_dim)


def _decode(
    q: mx.array,
    cache: LayerCache,
    meta: AttentionMetadata,
    scale: float,
    window: int | None,
    softcap: float | None,
    sinks: mx.array | None,
) -> mx.array:
    """One query per row, all rows at once: gather each row's blocks, mask the padding."""
    tables = meta.decode_block_tables
    assert tables is not None
    if meta.decode_token_idx is not None:
        q = q[meta.decode_token_idx]
    rows, heads, head_dim = q.shape
    keys = _gather(cache.k, tables, meta.block_size).transpose(0, 2, 1, 3)  # [D, kv_heads, S, d]
    values = _gather(cache.v, tables, meta.block_size).transpose(0, 2, 1, 3)
    mask = meta.decode_mask_for(window)
    if softcap is not None:
        assert mask is not None
        out = _capped_attention(q[:, :, None, :], keys, values, scale, softcap, mask)
    else:
        # SDPA handles grouped-query heads itself (head i reads KV head i // group): no K/V repeat.
        out = mx.fast.scaled_dot_product_attention(
            q[:, :, None, :], keys, values, scale=scale, mask=mask, sinks=sinks
        )  # [D, heads, 1, d]
    return out.reshape(rows, heads, head_dim)


def _prefill(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    cache: LayerCache,
    row: PrefillRow,
    block_size: int,
    scale: float,
    window: int | None,
    softcap: float | None,
    sinks: mx.array | None,
    pictures: bool = False,
) -> mx.array:
    both_ways = row.picture_mask if pictures else None
    if row.block_ids is None:
        keys, values = k[row.start : row.end], v[row.start : row.end]  # [L, kv_heads, d]
    else:
        keys = _gather(cache.k, row.block_ids, block_size)[: row.seq_len]  # [S, kv_heads, d]
        values = _gather(cache.v, row.block_ids, block_size)[: row.seq_len]
    if window is not None and window >= row.seq_len:  # the window covers the whole context
        window = None
    queries = q[row.start : row.end].transpose(1, 0, 2)[None]  # [1, heads, L, d]
    keys, values = keys.transpose(1, 0, 2)[None], values.transpose(1, 0, 2)[None]  # [1, kv_heads, S, d]
    if window is None and softcap is None and both_ways is None:
        # NOTE: MLX's "causal" mask aligns the last query with the last key (query i sees keys <= i + S - L),
        # which is exactly "position p sees positions <= p" for new tokens that end the row's context.
        out = mx.fast.scaled_dot_product_attention(
            queries, keys, values, scale=scale, mask="causal", sinks=sinks
        )
        return out[0].transpose(1, 0, 2)
    # The row's queries are the last L positions of its context: p = seq_len - L + i.
    q_pos = mx.arange(row.seq_len - (row.end - row.start), row.seq_len)[:, None]
    k_pos = mx.arange(row.seq_len)[None, :]
    mask = k_pos <= q_pos
    if both_ways is not None:  # OR(causal, picture), then the window, as transformers composes them
        mask = mask | both_ways
    if window is not None:
        mask = mask & (k_pos > q_pos - window)
    if softcap is None:
        out = mx.fast.scaled_dot_product_attention(queries, keys, values, scale=scale, mask=mask, sinks=sinks)
    else:
        out = _capped_attention(queries, keys, values, scale, softcap, mask)
    return out[0].transpose(1, 0, 2)  # [L, heads, d]


def _capped_attention(
    q: mx.array, k: mx.array, v: mx.array, scale: float, softcap: float, mask: mx.array
) -> mx.array:
    """Soft-capped attention in float32: q [B, heads, L, d], k/v [B, kv_heads, S, d], mask bool
    broadcastable to [B, heads, L, S] -> [B, heads, L, d]."""
    group = q.shape[1] // k.shape[1]
    if group > 1:  # head i reads KV head i // group
        k, v = mx.repeat(k, group, axis=1), mx.repeat(v, group, axis=1)
    scores = (q.astype(mx.float32) @ k.astype(mx.float32).transpose(0, 1, 3, 2)) * scale
    scores = mx.tanh(scores / softcap) * softcap
    scores = mx.where(mask, scores, mx.array(-mx.inf, dtype=mx.float32))
    return (mx.softmax(scores, axis=-1) @ v.astype(mx.float32)).astype(q.dtype)
