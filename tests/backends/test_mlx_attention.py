"""MLX paged attention against dense causal attention (numpy), with shuffled, non-contiguous block
tables, GQA, and batches that mix decode rows, fresh prefills and prefills over a cached prefix in
any order."""

from __future__ import annotations

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

from localchat.backends.mlx.attention import AttentionMetadata, LayerCache, paged_attention  # noqa: E402
from localchat.engine.interface import BatchInputs  # noqa: E402

pytestmark = pytest.mark.mlx

BLOCK = 4
HEAD_DIM = 16


def dense_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, first: int) -> np.ndarray:
    """q [L, h, d] for positions first..first+L-1 over k/v [S, kvh, d] at positions 0..S-1."""
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    scores = np.einsum("lhd,shd->hls", q, k) / HEAD_DIM**0.5
    q_pos = np.arange(first, first + q.shape[0])[:, None]
    scores = np.where(np.arange(k.shape[0])[None, :] > q_pos, -np.inf, scores)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return np.einsum("hls,shd->lhd", weights, v)


def _slot(table: list[int], pos: int) -> int:
    return table[pos // BLOCK] * BLOCK + pos % BLOCK


def run_case(rows: list[tuple[int, int]], heads: int, kv_heads: int, seed: int = 0) -> None:
    """rows: (num_cached, num_new) per request. Cached K/V are written first, as an earlier step would."""
    rng = np.random.default_rng(seed)
    num_blocks = 1 + sum(-(-(c + n) // BLOCK) for c, n in rows)
    ids = rng.permutation(np.arange(1, num_blocks))  # shuffled block ids
    cache_k = np.zeros((num_blocks * BLOCK, kv_heads, HEAD_DIM), dtype=np.float32)
    cache_v = np.zeros_like(cache_k)
    tables, full_k, full_v, new_q = [], [], [], []
    used = 0
    for cached, new in rows:
        total = cached + new
        n_blocks = -(-total // BLOCK)
        tables.append(ids[used : used + n_blocks].tolist())
        used += n_blocks
        full_k.append(rng.standard_normal((total, kv_heads, HEAD_DIM)).astype(np.float32))
        full_v.append(rng.standard_normal((total, kv_heads, HEAD_DIM)).astype(np.float32))
        new_q.append(rng.standard_normal((new, heads, HEAD_DIM)).astype(np.float32))
        for p in range(cached):
            cache_k[_slot(tables[-1], p)] = full_k[-1][p]
            cache_v[_slot(tables[-1], p)] = full_v[-1][p]
    cache = LayerCache(mx.array(cache_k), mx.array(cache_v))
    meta = AttentionMetadata.from_batch(_batch(rows, tables))
    k_new = np.concatenate([k[c:] for k, (c, _) in zip(full_k, rows, strict=True)])
    v_new = np.concatenate([v[c:] for v, (c, _) in zip(full_v, rows, strict=True)])
    out = paged_attention(
        mx.array(np.concatenate(new_q)), mx.array(k_new), mx.array(v_new), cache, meta, HEAD_DIM**-0.5
    )
    expected = np.concatenate(
        [dense_reference(q, k, v, c) for q, k, v, (c, _) in zip(new_q, full_k, full_v, rows, strict=True)]
    )
    np.testing.assert_allclose(np.array(out), expected, atol=1e-5, rtol=1e-5)
    # Every new K/V now sits at its slot, and nothing else moved.
    for (c, n), table, k in zip(rows, tables, full_k, strict=True):
        for p in range(c, c + n):
            cache_k[_slot(table, p)] = k[p]
    np.testing.assert_array_equal(np.array(cache.k), cache_k)


def _batch(rows: list[tuple[int, int]], tables: list[list[int]]) -> BatchInputs:
    positions = [p for c, n in rows for p in range(c, c + n)]
    slots = [_slot(t, p) for t, (c, n) in zip(tables, rows, strict=True) for p in range(c, c + n)]
    width = max(len(t) for t in tables) + 1  # wider than needed: padding with the null block
    qsl = np.concatenate([[0], np.cumsum([n for _, n in rows])]).astype(np.int32)
    return BatchInputs(
        req_ids=[str(i) for i in range(len(rows))],
        input_ids=np.zeros(len(positions), dtype=np.int64),
        positions=np.array(positions, dtype=np.int64),
        slot_mapping=np.array(slots, dtype=np.int64),
        query_start_loc=qsl,
        seq_lens=np.array([c + n for c, n in rows], dtype=np.int32),
        block_tables=np.array([t + [0] * (width - len(t)) for t in tables], dtype=np.int32),
        logits_indices=(qsl[1:] - 1).astype(np.int64),
        sample_req_ids=[str(i) for i in range(len(rows))],
        max_query_len=max(n for _, n in rows),
        max_seq_len=max(c + n for c, n in rows),
        block_size=BLOCK,
    )


@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (4, 2), (6, 1)])
def test_decode_rows_of_different_lengths(heads: int, kv_heads: int) -> None:
    run_case([(0, 1), (5, 1), (12, 1), (3, 1)], heads, kv_heads)


@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (4, 2)])
def test_fresh_prefills(heads: int, kv_heads: int) -> None:
    run_case([(0, 7), (0, 2), (0, 13)], heads, kv_heads)


def test_prefill_over_cached_prefix_and_chunks() -> None:
    run_case([(8, 5), (3, 6), (12, 4)], 4, 2)


def test_mixed_rows_in_any_order() -> None:
    """Prefill rows before, between and after decode rows: outputs return in token order."""
    run_case([(6, 5), (9, 1), (0, 7), (4, 1), (2, 3), (11, 1)], 4, 2, seed=3)
