"""Paged attention kernels for CUDA, in Triton: they read K/V through the block table in place.

The CPU path (attention.py) gathers each row's blocks into a fresh tensor per layer per step and runs
one SDPA call per prefill row; on a GPU that copies the whole KV cache every step and launches
thousands of small kernels per token. Here every step is at most three launches per layer:

- `_decode_kernel`: all one-query rows at once. One program per (row, KV head, split) loads the KV
  head's `group` query heads together (GQA: each K/V tile is read once for the whole group), walks its
  share of the context `BLOCK_N` tokens at a time (block ids gathered from the table per token, so any
  block size and any holes work), with an online softmax in float32.
- `_reduce_kernel`: split-K. Long contexts with few rows would leave most SMs idle, so the context is
  cut into `num_splits` parts whose partial sums (unnormalised, with their running max and sum) are
  merged here. One split writes the output directly and skips this launch.
- `_prefill_kernel`: all multi-query rows (prefill, chunked prefill, cached prefix) in one launch over
  `(tile, head)`: a tile is `BLOCK_M` consecutive queries of one row. New K/V are written to the cache
  first (as on the CPU), so cached and new keys are read the same way; the mask is `key position <=
  query position`.

Per-layer `AttentionOptions` (attention.py) as on the CPU: a score scale, a soft-cap (`cap *
tanh(score / cap)` before masking; a constexpr, so uncapped layers compile without it) and a sliding
window (query p sees p - W < k <= p). A window narrows each loop to the keys it can see: a decode row
walks only its last W keys (split-K divides those), a prefill tile starts at its first query's window.

Cache layout, as on the CPU: per layer `[2, kv_heads, num_slots, head_dim]`, slot = block * block_size +
offset. Shapes are static for a given batch size and `max_seq_len` bound, so a decode step can be
captured in a CUDA graph (cuda_graphs.py). Tested on CPU tensors under Triton's interpreter
(`TRITON_INTERPRET=1`, tests/backends/test_triton_attention.py) against the CPU path.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from localchat.backends.torch.attention_meta import AttentionOptions, write_kv
from localchat.backends.torch.cuda.gpu_attention_meta import BLOCK_M, BLOCK_N, TritonAttentionMetadata, pow2

MIN_DOT = 16  # tl.dot needs every dimension >= 16: small query groups are padded up to it
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"  # Triton reads it when decorating kernels
NO_WINDOW = 1 << 30  # "window" of full-attention layers: p - NO_WINDOW < k holds for every key (int32-safe)


@triton.jit
def _dot(a, b, F32: tl.constexpr):
    # NOTE: if/else, not a ternary: Triton's JIT resolves branches on constexprs at compile time.
    if F32:  # noqa: SIM108
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        out = tl.dot(a, b)
    return out


@triton.jit
def _tanh(x):
    # exp-based (no libdevice): exact at the saturated ends, within ~1e-7 absolute near zero.
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def _attend_keys(
    q, k_base, v_base, table, n, n_ok, visible, m_i, l_i, acc, scale, softcap,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, F32_DOTS: tl.constexpr,
    SOFTCAP: tl.constexpr,
):  # fmt: skip
    """One step of the online softmax over the keys at context positions `n` (BLOCK_N of them), read
    through the row's block table `table`; `visible` masks the scores. Returns (max, sum, acc)."""
    d = tl.arange(0, D_PAD)
    block = tl.load(table + n // BLOCK_SIZE, mask=n_ok, other=0)
    slot = block.to(tl.int64) * BLOCK_SIZE + n % BLOCK_SIZE
    kv_mask = n_ok[:, None] & (d < HEAD_DIM)[None, :]
    k = tl.load(k_base + slot[:, None] * HEAD_DIM + d[None, :], mask=kv_mask, other=0.0)  # [N, D_PAD]
    s = _dot(q, tl.trans(k), F32_DOTS) * scale  # [rows, N]
    if SOFTCAP:
        s = softcap * _tanh(s / softcap)
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    # A row that has seen no visible key yet (a window starts inside this step) keeps max -inf:
    # subtract 0 instead, so its weights are exp(-inf) = 0 rather than NaN.
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m_i - m_safe)
    p = tl.exp(s - m_safe[:, None])
    v = tl.load(v_base + slot[:, None] * HEAD_DIM + d[None, :], mask=kv_mask, other=0.0)
    return m_new, l_i * alpha + tl.sum(p, axis=1), acc * alpha[:, None] + _dot(p.to(v.dtype), v, F32_DOTS)


@triton.jit
def _decode_kernel(
    q_ptr,
    cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    dec_tokens_ptr,
    dec_rows_ptr,
    out_ptr,
    part_ptr,
    m_ptr,
    l_ptr,
    scale,
    softcap,
    window,
    tokens_per_split,
    stride_qt,
    stride_qh,
    stride_half,
    stride_head,
    stride_bt,
    num_heads,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    GROUP: tl.constexpr,
    G_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    F32_DOTS: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    r = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    token = tl.load(dec_tokens_ptr + r)
    brow = tl.load(dec_rows_ptr + r)
    seq_len = tl.load(seq_lens_ptr + brow)
    # The query is at seq_len - 1 and sees the last `window` keys: the splits share only those.
    lo = tl.maximum(seq_len - window, 0)
    start = lo + split * tokens_per_split
    end = tl.minimum(seq_len, start + tokens_per_split)

    g = tl.arange(0, G_PAD)
    d = tl.arange(0, D_PAD)
    g_ok = g < GROUP
    d_ok = d < HEAD_DIM
    heads = kvh * GROUP + g
    q = tl.load(
        q_ptr + token * stride_qt + heads[:, None] * stride_qh + d[None, :],
        mask=g_ok[:, None] & d_ok[None, :],
        other=0.0,
    )  # [G_PAD, D_PAD]
    k_base = cache_ptr + kvh * stride_head
    v_base = k_base + stride_half
    m_i = tl.full([G_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, D_PAD], tl.float32)
    table = block_tables_ptr + brow * stride_bt
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_ok = n < end
        m_i, l_i, acc = _attend_keys(
            q, k_base, v_base, table, n, n_ok, n_ok[None, :], m_i, l_i, acc, scale, softcap,
            HEAD_DIM, D_PAD, BLOCK_SIZE, F32_DOTS, SOFTCAP,
        )  # fmt: skip
    if NUM_SPLITS == 1:
        out = acc / l_i[:, None]
        tl.store(
            out_ptr + token * stride_qt + heads[:, None] * stride_qh + d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=g_ok[:, None] & d_ok[None, :],
        )
    else:
        # Partial results, indexed [row, head, split]; the reduce kernel merges the splits.
        at = (r * num_heads + heads) * NUM_SPLITS + split
        tl.store(m_ptr + at, m_i, mask=g_ok)
        tl.store(l_ptr + at, l_i, mask=g_ok)
        tl.store(part_ptr + at[:, None] * D_PAD + d[None, :], acc, mask=g_ok[:, None])


@triton.jit
def _reduce_kernel(
    part_ptr,
    m_ptr,
    l_ptr,
    dec_tokens_ptr,
    out_ptr,
    stride_qt,
    stride_qh,
    num_heads,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
):
    r = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, NUM_SPLITS)
    d = tl.arange(0, D_PAD)
    at = (r * num_heads + h) * NUM_SPLITS + s
    m = tl.load(m_ptr + at)
    l_s = tl.load(l_ptr + at)
    m_max = tl.max(m, axis=0)
    w = tl.where(m > float("-inf"), tl.exp(m - m_max), 0.0)  # empty splits weigh nothing
    part = tl.load(part_ptr + at[:, None] * D_PAD + d[None, :])  # [S, D_PAD]
    out = tl.sum(part * w[:, None], axis=0) / tl.sum(l_s * w, axis=0)
    token = tl.load(dec_tokens_ptr + r)
    tl.store(
        out_ptr + token * stride_qt + h * stride_qh + d, out.to(out_ptr.dtype.element_ty), mask=d < HEAD_DIM
    )


@triton.jit
def _prefill_kernel(
    q_ptr,
    cache_ptr,
    block_tables_ptr,
    positions_ptr,
    query_start_loc_ptr,
    tile_rows_ptr,
    tile_starts_ptr,
    out_ptr,
    scale,
    softcap,
    window,
    stride_qt,
    stride_qh,
    stride_half,
    stride_head,
    stride_bt,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    F32_DOTS: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    tile = tl.program_id(0)
    h = tl.program_id(1)
    row = tl.load(tile_rows_ptr + tile)
    q_start = tl.load(tile_starts_ptr + tile)
    q_end = tl.load(query_start_loc_ptr + row + 1)
    m_offs = q_start + tl.arange(0, BLOCK_M)
    m_ok = m_offs < q_end
    d = tl.arange(0, D_PAD)
    d_ok = d < HEAD_DIM
    q = tl.load(
        q_ptr + m_offs[:, None] * stride_qt + h * stride_qh + d[None, :],
        mask=m_ok[:, None] & d_ok[None, :],
        other=0.0,
    )  # [M, D_PAD]
    pos = tl.load(positions_ptr + m_offs, mask=m_ok, other=0)
    pos = tl.where(m_ok, pos, tl.load(positions_ptr + q_start))  # padding rows: a copy of the first
    context = tl.max(pos, axis=0) + 1  # causal: nothing past the tile's last query is read
    lo = tl.maximum(tl.min(pos, axis=0) - window + 1, 0)  # nor anything before the first one's window
    k_base = cache_ptr + (h // GROUP) * stride_head
    v_base = k_base + stride_half
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)
    table = block_tables_ptr + row * stride_bt
    for n0 in range(lo, context, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_ok = n < context
        # Query p sees p - window < k <= p; its own key always, so no row ends with an empty sum.
        visible = (n[None, :] <= pos[:, None]) & (n[None, :] > pos[:, None] - window) & n_ok[None, :]
        m_i, l_i, acc = _attend_keys(
            q, k_base, v_base, table, n, n_ok, visible, m_i, l_i, acc, scale, softcap,
            HEAD_DIM, D_PAD, BLOCK_SIZE, F32_DOTS, SOFTCAP,
        )  # fmt: skip
    out = acc / l_i[:, None]
    tl.store(
        out_ptr + m_offs[:, None] * stride_qt + h * stride_qh + d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=m_ok[:, None] & d_ok[None, :],
    )


def triton_paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache: torch.Tensor,
    meta: TritonAttentionMetadata,
    options: AttentionOptions | None = None,
) -> torch.Tensor:
    """q [T, heads, d], k/v [T, kv_heads, d] (this step) -> [T, heads, d]. Writes k/v into the cache.
    `options`: sliding window, soft-cap and score scale, as attention.py defines them."""
    write_kv(k, v, cache, meta.slot_mapping)
    q = q.contiguous()
    out = torch.empty_like(q)
    heads, head_dim = q.shape[1], q.shape[2]
    kv_heads = cache.shape[1]
    group = heads // kv_heads
    d_pad = max(MIN_DOT, pow2(head_dim))
    options = options or AttentionOptions()
    scale = options.scale if options.scale is not None else 1.0 / head_dim**0.5
    # No window: one wider than any context, so the kernels' window arithmetic needs no branch.
    window = options.window or NO_WINDOW
    softcap = options.softcap or 1.0  # read only when SOFTCAP
    # fp32 is the exact path (no TF32 rounding in the dots). NOTE: the interpreter's tl.dot misreads
    # bf16 operands, so under it every dot runs on upcast values; bf16 MMAs are checked on a GPU.
    f32_dots = cache.dtype == torch.float32 or INTERPRET
    flags = {"F32_DOTS": f32_dots, "SOFTCAP": options.softcap is not None}
    strides = (q.stride(0), q.stride(1), cache.stride(0), cache.stride(1), meta.block_tables.stride(0))
    if meta.dec_tokens is not None and meta.dec_rows is not None:
        rows, splits = meta.dec_tokens.shape[0], meta.num_splits
        part = m = lse = out  # unused when there is a single split
        if splits > 1:
            part = torch.empty(rows * heads * splits * d_pad, dtype=torch.float32, device=q.device)
            m = torch.empty(rows * heads * splits, dtype=torch.float32, device=q.device)
            lse = torch.empty_like(m)
        _decode_kernel[(rows, kv_heads, splits)](
            q, cache, meta.block_tables, meta.seq_lens, meta.dec_tokens, meta.dec_rows, out, part, m, lse,
            scale, softcap, window, meta.tokens_per_split, *strides, heads,
            HEAD_DIM=head_dim, D_PAD=d_pad, GROUP=group, G_PAD=max(MIN_DOT, pow2(group)),
            BLOCK_SIZE=meta.block_size, BLOCK_N=BLOCK_N, NUM_SPLITS=splits, **flags,
        )  # fmt: skip
        if splits > 1:
            _reduce_kernel[(rows, heads)](
                part, m, lse, meta.dec_tokens, out, q.stride(0), q.stride(1), heads,
                HEAD_DIM=head_dim, D_PAD=d_pad, NUM_SPLITS=splits,
            )  # fmt: skip
    if meta.tile_rows is not None and meta.tile_starts is not None:
        _prefill_kernel[(meta.tile_rows.shape[0], heads)](
            q, cache, meta.block_tables, meta.positions, meta.query_start_loc, meta.tile_rows,
            meta.tile_starts, out, scale, softcap, window, *strides,
            HEAD_DIM=head_dim, D_PAD=d_pad, GROUP=group, BLOCK_SIZE=meta.block_size,
            BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, **flags,
        )  # fmt: skip
    return out
