"""Paged attention against dense causal attention on every backend: shuffled, non-contiguous block tables,
GQA, and batches that mix decode rows, fresh prefills and prefills over a cached prefix in any order.
Torch runs each case with the fused C decode kernel (when built) and on the pure-torch path; the
torch-only tests at the end check its attention metadata."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch

from localchat.backends.torch.attention import AttentionMetadata, paged_attention
from localchat.engine.interface import BatchInputs

BLOCK = 4
HEAD_DIM = 16
TORCH_KERNELS = ["auto", "off"]  # LOCALCHAT_KERNELS: the fused C decode kernel, and the pure-torch path
BACKENDS = [*(f"torch-{k}" for k in TORCH_KERNELS), pytest.param("mlx", marks=pytest.mark.mlx)]

# (rows, heads, kv_heads, seed); rows are (num_cached, num_new) per request.
CASES = {
    **{
        f"{name}-{h}h{kvh}kv": ([*rows], h, kvh, 0)
        for name, rows in {
            "prefill": [(0, 9)],
            "prefill-over-cache": [(8, 5)],
            "middle-chunk": [(6, 3)],  # not block aligned
            "decode-ragged": [(5, 1), (17, 1), (0, 1), (2, 1)],
            "decode-and-prefills": [(7, 1), (0, 6), (4, 4), (12, 1)],
        }.items()
        for h, kvh in [(4, 2), (4, 4), (6, 1)]
    },
    **{
        f"decode-lengths-{h}h{kvh}kv": ([(0, 1), (5, 1), (12, 1), (3, 1)], h, kvh, 0)
        for h, kvh in [(4, 4), (4, 2), (6, 1)]
    },
    **{f"fresh-prefills-{h}h{kvh}kv": ([(0, 7), (0, 2), (0, 13)], h, kvh, 0) for h, kvh in [(4, 4), (4, 2)]},
    "prefills-over-cache-and-chunks": ([(8, 5), (3, 6), (12, 4)], 4, 2, 0),
    # prefill rows before, between and after decode rows: outputs return in token order
    "mixed-in-any-order": ([(6, 5), (9, 1), (0, 7), (4, 1), (2, 3), (11, 1)], 4, 2, 3),
}


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


@dataclass
class Case:
    """One batch's inputs: the cache holds the cached K/V [slots, kv_heads, d] at their slots."""

    rows: list[tuple[int, int]]
    tables: list[list[int]]
    cache_k: np.ndarray
    cache_v: np.ndarray
    q: np.ndarray  # the new rows' queries, in token order
    k_new: np.ndarray
    v_new: np.ndarray
    expected: np.ndarray
    cache_k_after: np.ndarray  # the cache once every new K has been written at its slot


def make_case(
    rows: list[tuple[int, int]], heads: int, kv_heads: int, seed: int = 0, shuffle: bool = True
) -> Case:
    rng = np.random.default_rng(seed)
    num_blocks = 1 + sum(-(-(c + n) // BLOCK) for c, n in rows)
    ids = np.arange(1, num_blocks)
    if shuffle:
        ids = rng.permutation(ids)
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
    after = cache_k.copy()
    for (c, n), table, k in zip(rows, tables, full_k, strict=True):
        for p in range(c, c + n):
            after[_slot(table, p)] = k[p]
    return Case(
        rows,
        tables,
        cache_k,
        cache_v,
        np.concatenate(new_q),
        np.concatenate([k[c:] for k, (c, _) in zip(full_k, rows, strict=True)]),
        np.concatenate([v[c:] for v, (c, _) in zip(full_v, rows, strict=True)]),
        np.concatenate(
            [dense_reference(q, k, v, c) for q, k, v, (c, _) in zip(new_q, full_k, full_v, rows, strict=True)]
        ),
        after,
    )


def torch_attention(case: Case) -> tuple[np.ndarray, np.ndarray, Any]:
    """(output, the cache's K afterwards, the attention metadata) on the torch backend."""
    kv_heads = case.cache_k.shape[1]
    cache = torch.from_numpy(np.stack([case.cache_k, case.cache_v]).transpose(0, 2, 1, 3).copy())
    meta = AttentionMetadata.from_batch(_batch(case.rows, case.tables), torch.device("cpu"), kv_heads)
    out = paged_attention(
        torch.from_numpy(case.q), torch.from_numpy(case.k_new), torch.from_numpy(case.v_new), cache, meta
    )
    return out.numpy(), cache[0].transpose(0, 1).numpy(), meta


def mlx_attention(case: Case) -> tuple[np.ndarray, np.ndarray, Any]:
    mx = pytest.importorskip("mlx.core")
    from localchat.backends.mlx import attention

    cache = attention.LayerCache(mx.array(case.cache_k), mx.array(case.cache_v))
    meta = attention.AttentionMetadata.from_batch(_batch(case.rows, case.tables))
    out = attention.paged_attention(
        mx.array(case.q), mx.array(case.k_new), mx.array(case.v_new), cache, meta, HEAD_DIM**-0.5
    )
    return np.array(out), np.array(cache.k), meta


def run_case(backend: str, case: Case, monkeypatch: pytest.MonkeyPatch) -> Any:
    if backend == "mlx":
        out, cache_k, meta = mlx_attention(case)
    else:
        monkeypatch.setenv("LOCALCHAT_KERNELS", backend.removeprefix("torch-"))
        out, cache_k, meta = torch_attention(case)
    np.testing.assert_allclose(out, case.expected, atol=1e-5, rtol=1e-5)
    # Every new K now sits at its slot, and nothing else moved.
    np.testing.assert_array_equal(cache_k, case.cache_k_after)
    return meta


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@pytest.mark.parametrize("backend", BACKENDS)
def test_paged_matches_dense(backend: str, case: tuple[Any, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    rows, heads, kv_heads, seed = case
    run_case(backend, make_case(rows, heads, kv_heads, seed), monkeypatch)


# Torch only: its metadata's decode shortcuts.


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("cached", [0, 3, 8, 13])
@pytest.mark.parametrize("kernels", TORCH_KERNELS)
def test_torch_single_stream_decode(
    kernels: str, cached: int, shuffle: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One decode row: sliced to its length; read in place when its blocks are consecutive."""
    meta = run_case(
        f"torch-{kernels}", make_case([(cached, 1)], 4, 2, seed=cached, shuffle=shuffle), monkeypatch
    )
    assert meta.decode_bias is None and meta.decode_len == cached + 1
    assert (meta.decode_span is not None) == (not shuffle or cached < BLOCK)


def test_torch_decode_only_batch_is_one_batched_call() -> None:
    rows = [(5, 1), (17, 1), (0, 1)]
    meta = AttentionMetadata.from_batch(
        _batch(rows, [[1, 2], [3, 4, 5, 6, 7], [8]]), torch.device("cpu"), kv_heads=2
    )
    assert not meta.prefills and meta.decode_token_idx is None
    assert meta.decode_block_tables is not None and meta.decode_block_tables.shape == (15,)
    # one additive bias row per (kv head, row), masking each row's padding
    assert meta.decode_bias is not None and meta.decode_bias.shape == (6, 1, 20)
    allowed = (meta.decode_bias[:, 0] == 0).sum(-1).tolist()
    assert allowed == [6, 18, 1] * 2


@pytest.mark.parametrize("kernels", TORCH_KERNELS)
def test_torch_reads_blocks_written_by_another_row_in_the_same_step(
    kernels: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Row b's cached prefix lives in blocks row a writes this step: writes must land before reads."""
    monkeypatch.setenv("LOCALCHAT_KERNELS", kernels)
    gen = torch.Generator().manual_seed(1)
    heads, kv_heads = 4, 2
    cache = torch.zeros(2, kv_heads, 8 * BLOCK, HEAD_DIM)
    k = torch.randn(12, kv_heads, HEAD_DIM, generator=gen)
    v = torch.randn(12, kv_heads, HEAD_DIM, generator=gen)
    q = torch.randn(12, heads, HEAD_DIM, generator=gen)
    # a computes positions 0..7 into blocks [5, 2]; b has them "cached" there and computes 8..11 in block 6.
    batch = _batch([(0, 8), (8, 4)], [[5, 2], [5, 2, 6]])
    meta = AttentionMetadata.from_batch(batch, torch.device("cpu"), kv_heads)
    out = paged_attention(q, k, v, cache, meta).numpy()
    q_np, k_np, v_np = q.numpy(), k.numpy(), v.numpy()
    np.testing.assert_allclose(
        out[:8], dense_reference(q_np[:8], k_np[:8], v_np[:8], 0), atol=1e-5, rtol=1e-5
    )
    np.testing.assert_allclose(out[8:], dense_reference(q_np[8:], k_np, v_np, 8), atol=1e-5, rtol=1e-5)
