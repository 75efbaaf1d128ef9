"""Paged attention over a block-table KV cache, in plain PyTorch.

Cache layout, per layer: one tensor `[2, kv_heads, num_slots, head_dim]` (K, then V), `num_slots =
num_blocks * block_size`; token slot `s = block_id * block_size + offset` is column `s`. Each head's
keys are contiguous, so a row whose blocks are consecutive reads its whole context as one slice, and
a block gather (`index_select` over `[2, kv_heads, num_blocks, block_size, head_dim]`) copies whole
rows of memory. Each step first writes every new K/V at `slot_mapping`, then attends, because a
request may read blocks that another request of the same batch writes this step (shared prefix).

Rows with one query token (decode, or a one-token prefill chunk) are attended all at once with two
batched matmuls in float32 (scores, then probabilities @ values), padding masked by an additive bias;
rows with several query tokens (prefill, chunked prefill) go through SDPA one by one.
NOTE: for one query token, SDPA's CPU kernel costs ~130 us per layer for what two float32 `bmm`s do
in ~60 (SmolLM2-135M, 600+ tokens of context, dev box): its setup per call dominates at this size.
One SDPA call for all decode rows (KV heads as heads, each one's query heads as query positions, a
bool padding mask) was tried too: equal CPU time per 16-row step, and slightly worse bf16 numerics.
So was a float32 cache (no upcast copy): no faster single-stream or 16-row, 35% slower single-stream
once a prefix hit makes the blocks non-consecutive (the gather moves twice the bytes), 2x the memory.

Per-layer `AttentionOptions` (sliding window, logit soft-cap, score scale) take a separate path, so
full-attention layers (options None) run exactly the code above. A window W follows transformers: the
query at position p sees keys at positions p - W < k <= p. Blocks that fall out of the window stay
allocated (the block manager frees by request, not by position).

Decode rows on CPU with localchat's compiled kernels loaded (kernels.py; `LOCALCHAT_KERNELS=off`
disables them) take instead one fused C call (csrc/lc_attention.h) that reads the blocks in place: no
gather, no upcast copy, no padding bias. The torch path above stays the fallback and the CUDA path
(`LOCALCHAT_TORCH_ATTENTION=torch` forces it on CPU). windowed_attention.py's decode rows use the
same kernel (its C API takes the window, soft-cap and scale). Prefill rows use it too, one kernel row
per query whose context ends at its own position (`_prefill_on_kernel`), where the cache holds this
step's k/v unrounded (its dtype is the compute dtype).

`--kv-cache-dtype int8` (kv_cache.py): the cache is an `Int8KVCache` (codes in the layout above plus
float32 scales `[2, kv_heads, num_slots]`). Writes quantize; the torch paths dequantize what they
gather (to float32, as they upcast a bf16 cache); the C kernel reads the int8 rows in place.
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
    write_kv,
)
from localchat.backends.torch.cpu import kernels as cpu_kernels
from localchat.backends.torch.cpu.padded_sdpa import prefill_sdpa
from localchat.backends.torch.cuda.gpu_attention_meta import TritonAttentionMetadata
from localchat.backends.torch.kv_cache import Int8KVCache, KVCache, span_int8
from localchat.backends.torch.layers import apply_rope
from localchat.backends.torch.picture_attention import causal_mask


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache: KVCache,
    meta: AttentionMetadata | TritonAttentionMetadata,
    options: AttentionOptions | None = None,
) -> torch.Tensor:
    """q [T, heads, d], k/v [T, kv_heads, d] (this step) -> [T, heads, d]. Writes k/v into the cache."""
    if isinstance(meta, TritonAttentionMetadata):  # CUDA: kernels that read the block table in place
        from localchat.backends.torch.cuda.triton_attention import triton_paged_attention

        assert isinstance(cache, torch.Tensor), "the runner keeps int8 KV caches off the Triton path"
        if options is not None and options.sinks is not None:
            raise NotImplementedError("attention sinks (gpt-oss) are not in the Triton kernels yet")
        return triton_paged_attention(q, k, v, cache, meta, options)
    write_kv(k, v, cache, meta.slot_mapping)
    if options is not None and options.matter(meta.max_seq_len):
        from localchat.backends.torch.cpu.windowed_attention import attend_with_options

        return attend_with_options(q, k, v, cache, meta, options)
    if not meta.prefills:
        return _decode(q, cache, meta)
    out = torch.empty_like(q)
    if meta.decode_block_tables is not None:
        out[meta.decode_token_idx] = _decode(q[meta.decode_token_idx], cache, meta)
    both_ways = options is not None and options.pictures_both_ways
    for row in meta.prefills:
        pictures = row.picture_mask if both_ways else None
        if pictures is None and _prefill_on_kernel(q, cache, row, meta):
            assert meta.cpu_kernels is not None and row.table is not None
            if row.per_query is None:  # once per step: every layer reads the same tables
                queries = row.end - row.start
                lens = torch.arange(row.seq_len - queries + 1, row.seq_len + 1, device=q.device)
                row.per_query = row.table.expand(queries, -1).contiguous(), lens
            out[row.start : row.end] = meta.cpu_kernels.decode_attention(
                q[row.start : row.end], cache, *row.per_query, meta.block_size, 1 / math.sqrt(q.shape[2])
            )
        else:
            out[row.start : row.end] = _prefill(q, k, v, cache, row, meta.block_size, pictures)
    return out


def _prefill_on_kernel(q: torch.Tensor, cache: KVCache, row: PrefillRow, meta: AttentionMetadata) -> bool:
    """Whether a prefill row's attention runs as one decode-kernel row per query, over the cache it was
    just written to: each query sees the keys up to its position, which is causal attention. On a
    2-core CPU a 1B model's 507-token prefill spent 176 ms in it against ~250 ms in torch's SDPA (the
    kernel reads the bf16 blocks in place, no per-head copies; SDPA reached ~33 GFLOPS). Only where the
    cache holds this step's k/v exactly (its dtype is q's: an int8 cache would give the new tokens'
    rounded codes where the torch path uses them unrounded)."""
    return (
        meta.cpu_kernels is not None
        and row.table is not None
        and isinstance(cache, torch.Tensor)  # not an Int8KVCache
        and cache.dtype == q.dtype
        and cpu_kernels.decode_attention_ok(q, cache)
    )


def rope_paged_attention(
    qk: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    cache: KVCache,
    meta: AttentionMetadata | TritonAttentionMetadata,
    options: AttentionOptions | None = None,
) -> torch.Tensor:
    """qk [T, heads + kv_heads, d] before RoPE, v [T, kv_heads, d] -> attention [T, heads, d]: RoPE
    (layers.apply_rope), then `paged_attention`. A decode-only CPU step with the compiled kernels does
    all of it in one C call (csrc/lc_fused.h: rotation, cache write, attention), which at a small
    model's decode step saves more time than the attention itself takes."""
    heads = qk.shape[1] - v.shape[1]
    sinks = options is not None and options.sinks is not None  # the C kernel has no sink term
    if not sinks and _fused_decode_ok(qk, v, cos, sin, cache, meta):
        assert isinstance(meta, AttentionMetadata) and meta.cpu_kernels is not None
        assert isinstance(cache, torch.Tensor)
        assert meta.decode_block_tables is not None and meta.decode_lens64 is not None
        window, softcap, scale = 0, 0.0, 1 / math.sqrt(qk.shape[2])
        if options is not None and options.matter(meta.max_seq_len):
            window, softcap = options.window or 0, options.softcap or 0.0
            scale = options.scale if options.scale is not None else scale
        return meta.cpu_kernels.decode_rope_attention(
            qk, v, cos, sin, cache, meta.slot_mapping, meta.decode_block_tables.view(v.shape[0], -1),
            meta.decode_lens64, meta.block_size, scale, window, softcap,
        )  # fmt: skip
    qk = apply_rope(qk, cos, sin)
    return paged_attention(qk[:, :heads], qk[:, heads:], v, cache, meta, options)


def _fused_decode_ok(
    qk: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    cache: KVCache,
    meta: AttentionMetadata | TritonAttentionMetadata,
) -> bool:
    """Whether `Kernels.decode_rope_attention` serves this step: decode rows only, on CPU with the kernels,
    a float32/bfloat16 cache, full-width rotary, one dtype, heads and dims laid out densely."""
    if not isinstance(meta, AttentionMetadata) or meta.cpu_kernels is None or meta.prefills:
        return False
    if isinstance(cache, Int8KVCache) or cache.dtype not in (torch.float32, torch.bfloat16):
        return False
    d, heads, kv_heads = qk.shape[2], qk.shape[1] - v.shape[1], v.shape[1]
    return (
        cache.is_contiguous()
        and d <= cpu_kernels.ATTENTION_MAX_HEAD_DIM
        and heads % kv_heads == 0
        and heads // kv_heads <= cpu_kernels.ATTENTION_MAX_GROUP
        and cos.shape[-1] == d
        and cos.shape == sin.shape
        and qk.dtype == v.dtype == cos.dtype == sin.dtype
        and qk.stride(2) == v.stride(2) == 1
        and qk.stride(1) == v.stride(1) == d
        and cos.is_contiguous()
        and sin.is_contiguous()
    )


def _decode(q: torch.Tensor, cache: KVCache, meta: AttentionMetadata) -> torch.Tensor:
    """One query per row, all rows at once: [D, heads, d] -> [D, heads, d]."""
    rows, heads, head_dim = q.shape
    if meta.cpu_kernels is not None and cpu_kernels.decode_attention_ok(q, cache):
        assert meta.decode_block_tables is not None and meta.decode_lens64 is not None
        tables = meta.decode_block_tables.view(rows, -1)
        return meta.cpu_kernels.decode_attention(
            q, cache, tables, meta.decode_lens64, meta.block_size, 1 / math.sqrt(head_dim)
        )
    kv_heads = cache.shape[1]
    group = heads // kv_heads
    if meta.decode_span is not None:
        # float32 so the scores and softmax weights stay unrounded (a view if the cache is float32).
        span = meta.decode_span, meta.decode_span + meta.decode_len
        if isinstance(cache, Int8KVCache):
            kv = span_int8(cache, *span)  # [2, kvh, S, d]
        else:
            kv = cache[:, :, span[0] : span[1]].float()  # [2, kvh, S, d]
        grouped = q.view(kv_heads, group, head_dim).float()  # rows == 1: [kvh, group, d]
    else:
        assert meta.decode_block_tables is not None
        kv = gather_blocks(cache, meta.decode_block_tables, meta.block_size).float()  # [2, kvh, D*S, d]
        kv = kv.view(2, kv_heads * rows, -1, head_dim)  # batch index: kv head * D + row
        if meta.decode_bias is None:  # one row: drop the block padding instead of masking it
            kv = kv[:, :, : meta.decode_len]
        # [D, heads, d] -> [kvh * D, group, d], each query head next to the KV head it reads
        grouped = q.view(rows, kv_heads, group, head_dim).transpose(0, 1).reshape(-1, group, head_dim).float()
    scale = 1 / math.sqrt(head_dim)
    keys_t = kv[0].transpose(1, 2)  # [B, d, S]
    if meta.decode_bias is None:
        scores = torch.bmm(grouped, keys_t).mul_(scale)  # [B, group, S]
    else:
        scores = torch.baddbmm(meta.decode_bias, grouped, keys_t, alpha=scale)
    out = torch.bmm(scores.softmax(dim=-1), kv[1])  # [B, group, d]
    out = out.view(kv_heads, rows, group, head_dim).transpose(0, 1)
    return out.reshape(rows, heads, head_dim).to(q.dtype)


def _prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache: KVCache,
    row: PrefillRow,
    block_size: int,
    pictures: torch.Tensor | None = None,
) -> torch.Tensor:
    """`pictures`: the row's picture mask, for a layer that sees pictures both ways (picture_attention.py)."""
    keys, values = row_keys_values(k, v, cache, row, block_size, q.shape[1])
    mask = row.mask if pictures is None else causal_mask(row, q.device) | pictures
    out = prefill_sdpa(q[row.start : row.end].transpose(0, 1), keys, values, mask)  # [heads, L, d]
    return out.transpose(0, 1)
