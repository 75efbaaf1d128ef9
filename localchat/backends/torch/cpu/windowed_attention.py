"""The CPU paged-attention path for layers with `AttentionOptions`: sliding window, logit soft-cap,
a score scale other than 1 / sqrt(head_dim) (Gemma 2/3, Mistral's window).

Same cache and metadata as attention.py (the K/V of this step are already written). Decode rows take
the fused C kernel when attention.py's would (its API has the window, soft-cap and scale), else two
batched float32 matmuls with a per-window bias; prefill rows through SDPA with a window
mask, or explicit float32 math when the scores are soft-capped (SDPA has no hook between the scores
and the softmax). An int8 cache (kv_cache.py) is read like attention.py reads it: dequantized on gather,
in place by the C kernel.
"""

from __future__ import annotations

import math

import torch

from localchat.backends.torch.attention_meta import (
    AttentionMetadata,
    AttentionOptions,
    PrefillRow,
    gather_blocks,
    row_keys_values,
)
from localchat.backends.torch.cpu import kernels as cpu_kernels
from localchat.backends.torch.cpu.padded_sdpa import prefill_sdpa
from localchat.backends.torch.kv_cache import KVCache


def attend_with_options(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache: KVCache,
    meta: AttentionMetadata,
    options: AttentionOptions,
) -> torch.Tensor:
    """q [T, heads, d], k/v [T, kv_heads, d] (already in the cache) -> [T, heads, d]."""
    if not meta.prefills:
        return _decode(q, cache, meta, options)
    out = torch.empty_like(q)
    if meta.decode_block_tables is not None:
        out[meta.decode_token_idx] = _decode(q[meta.decode_token_idx], cache, meta, options)
    for row in meta.prefills:
        out[row.start : row.end] = _prefill(q, k, v, cache, row, meta.block_size, options)
    return out


def _scale(options: AttentionOptions, head_dim: int) -> float:
    return options.scale if options.scale is not None else 1 / math.sqrt(head_dim)


def _softcap(scores: torch.Tensor, cap: float | None) -> torch.Tensor:
    return scores if cap is None else torch.tanh(scores / cap) * cap


def _decode(
    q: torch.Tensor, cache: KVCache, meta: AttentionMetadata, options: AttentionOptions
) -> torch.Tensor:
    """One query per row, all rows at once: [D, heads, d] -> [D, heads, d]."""
    assert meta.decode_block_tables is not None
    rows, heads, head_dim = q.shape
    kernel_ok = options.sinks is None  # the C kernel has no sink term: gpt-oss decodes in torch
    if kernel_ok and meta.cpu_kernels is not None and cpu_kernels.decode_attention_ok(q, cache):
        assert meta.decode_lens64 is not None
        tables = meta.decode_block_tables.view(rows, -1)
        scale, window, cap = _scale(options, head_dim), options.window or 0, options.softcap or 0.0
        return meta.cpu_kernels.decode_attention(
            q, cache, tables, meta.decode_lens64, meta.block_size, scale, window, cap
        )
    kv_heads = cache.shape[1]
    group = heads // kv_heads
    kv = gather_blocks(cache, meta.decode_block_tables, meta.block_size).float()  # [2, kvh, D*S, d]
    kv = kv.view(2, kv_heads * rows, -1, head_dim)  # batch index: kv head * D + row
    grouped = q.view(rows, kv_heads, group, head_dim).transpose(0, 1).reshape(-1, group, head_dim).float()
    scores = torch.bmm(grouped, kv[0].transpose(1, 2)).mul_(_scale(options, head_dim))  # [B, group, S]
    scores = _softcap(scores, options.softcap) + meta.window_bias(options.window, kv_heads, kv.shape[2])
    if options.sinks is not None:  # batch index kv head * D + row, group index: head within the group
        sinks = options.sinks.float().view(kv_heads, 1, group, 1).expand(kv_heads, rows, group, 1)
        probs = _with_sinks(scores, sinks.reshape(-1, group, 1))
    else:
        probs = scores.softmax(dim=-1)
    out = torch.bmm(probs, kv[1])  # [B, group, d]
    out = out.view(kv_heads, rows, group, head_dim).transpose(0, 1)
    return out.reshape(rows, heads, head_dim).to(q.dtype)


def _prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache: KVCache,
    row: PrefillRow,
    block_size: int,
    options: AttentionOptions,
) -> torch.Tensor:
    head_dim = q.shape[2]
    keys, values = row_keys_values(k, v, cache, row, block_size, q.shape[1])
    # The row's queries are the last L positions of its context: p = seq_len - L + i.
    q_len = row.end - row.start
    q_pos = torch.arange(row.seq_len - q_len, row.seq_len, device=q.device)[:, None]
    k_pos = torch.arange(row.seq_len, device=q.device)[None, :]
    mask = k_pos <= q_pos
    if options.pictures_both_ways and row.picture_mask is not None:  # OR(causal, picture), then the window
        mask |= row.picture_mask
    if options.window is not None:
        mask &= k_pos > q_pos - options.window
    scale = _scale(options, head_dim)
    queries = q[row.start : row.end].transpose(0, 1)  # [heads, L, d]
    if options.softcap is None and options.sinks is None:
        out = prefill_sdpa(queries, keys, values, mask, scale)  # [heads, L, d]
    else:
        scores = torch.matmul(queries.float(), keys.float().transpose(1, 2)) * scale  # [heads, L, S]
        scores = _softcap(scores, options.softcap).masked_fill(~mask, float("-inf"))
        if options.sinks is None:
            probs = scores.softmax(dim=-1)
        else:
            probs = _with_sinks(scores, options.sinks.float()[:, None, None].expand(-1, q_len, 1))
        out = torch.matmul(probs, values.float()).to(q.dtype)
    return out.transpose(0, 1)


def _with_sinks(scores: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """softmax over scores [..., S] with one more logit per row (`sinks` [..., 1]) in the denominator;
    the sink's own probability is dropped (it weighs no value), as transformers' gpt-oss does."""
    return torch.cat([scores, sinks], dim=-1).softmax(dim=-1)[..., :-1]
