"""Paged attention against dense causal attention, with shuffled, non-contiguous block tables."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from localchat.backends.torch.attention import AttentionMetadata, paged_attention, write_kv
from localchat.engine.interface import BatchInputs

BLOCK = 4
HEAD_DIM = 16


@pytest.fixture(autouse=True, params=["auto", "off"])
def cpu_kernels(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every case runs with the fused C decode kernel (when built) and on the pure-torch path."""
    monkeypatch.setenv("LOCALCHAT_KERNELS", request.param)


def dense_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, first: int) -> torch.Tensor:
    """q [L, h, d] for positions first..first+L-1 over k/v [S, kvh, d] at positions 0..S-1."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.einsum("lhd,shd->hls", q, k) / HEAD_DIM**0.5
    q_pos = torch.arange(first, first + q.shape[0])[:, None]
    scores = scores.masked_fill(torch.arange(k.shape[0])[None, :] > q_pos, float("-inf"))
    return torch.einsum("hls,shd->lhd", scores.softmax(-1), v)


def run_case(
    rows: list[tuple[int, int]], heads: int, kv_heads: int, seed: int = 0, shuffle: bool = True
) -> AttentionMetadata:
    """rows: (num_cached, num_new) per request. Cached K/V are written first, as an earlier step would."""
    gen = torch.Generator().manual_seed(seed)
    num_blocks = 1 + sum(-(-(c + n) // BLOCK) for c, n in rows)
    ids = np.arange(1, num_blocks)
    if shuffle:
        ids = np.random.default_rng(seed).permutation(ids)
    cache = torch.zeros(2, kv_heads, num_blocks * BLOCK, HEAD_DIM)
    tables, full_k, full_v, new_q = [], [], [], []
    used = 0
    for cached, new in rows:
        total = cached + new
        n_blocks = -(-total // BLOCK)
        tables.append(ids[used : used + n_blocks].tolist())
        used += n_blocks
        full_k.append(torch.randn(total, kv_heads, HEAD_DIM, generator=gen))
        full_v.append(torch.randn(total, kv_heads, HEAD_DIM, generator=gen))
        new_q.append(torch.randn(new, heads, HEAD_DIM, generator=gen))
        if cached:
            slots = torch.tensor([_slot(tables[-1], p) for p in range(cached)])
            write_kv(full_k[-1][:cached], full_v[-1][:cached], cache, slots)
    batch = _batch(rows, tables)
    meta = AttentionMetadata.from_batch(batch, torch.device("cpu"), kv_heads)
    k_new = torch.cat([k[c:] for k, (c, _) in zip(full_k, rows, strict=True)])
    v_new = torch.cat([v[c:] for v, (c, _) in zip(full_v, rows, strict=True)])
    out = paged_attention(torch.cat(new_q), k_new, v_new, cache, meta)
    expected = torch.cat(
        [dense_reference(q, k, v, c) for q, k, v, (c, _) in zip(new_q, full_k, full_v, rows, strict=True)]
    )
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    return meta


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


@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 2), (4, 4), (6, 1)])
@pytest.mark.parametrize(
    "rows",
    [
        [(0, 9)],  # plain prefill
        [(8, 5)],  # prefill over a cached prefix
        [(6, 3)],  # middle chunk, not block aligned
        [(5, 1), (17, 1), (0, 1), (2, 1)],  # decode-only batch, ragged lengths
        [(7, 1), (0, 6), (4, 4), (12, 1)],  # mixed decode + prefills
    ],
)
def test_paged_matches_dense(rows: list[tuple[int, int]], heads: int, kv_heads: int) -> None:
    run_case(rows, heads, kv_heads)


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("cached", [0, 3, 8, 13])
def test_single_stream_decode(cached: int, shuffle: bool) -> None:
    """One decode row: sliced to its length; read in place when its blocks are consecutive."""
    meta = run_case([(cached, 1)], 4, 2, seed=cached, shuffle=shuffle)
    assert meta.decode_bias is None and meta.decode_len == cached + 1
    assert (meta.decode_span is not None) == (not shuffle or cached < BLOCK)


def test_decode_only_batch_is_one_batched_call() -> None:
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


def test_reads_blocks_written_by_another_row_in_the_same_step() -> None:
    """Row b's cached prefix lives in blocks row a writes this step: writes must land before reads."""
    gen = torch.Generator().manual_seed(1)
    heads, kv_heads = 4, 2
    cache = torch.zeros(2, kv_heads, 8 * BLOCK, HEAD_DIM)
    k = torch.randn(12, kv_heads, HEAD_DIM, generator=gen)
    v = torch.randn(12, kv_heads, HEAD_DIM, generator=gen)
    q = torch.randn(12, heads, HEAD_DIM, generator=gen)
    # a computes positions 0..7 into blocks [5, 2]; b has them "cached" there and computes 8..11 in block 6.
    batch = _batch([(0, 8), (8, 4)], [[5, 2], [5, 2, 6]])
    meta = AttentionMetadata.from_batch(batch, torch.device("cpu"), kv_heads)
    out = paged_attention(q, k, v, cache, meta)
    torch.testing.assert_close(out[:8], dense_reference(q[:8], k[:8], v[:8], 0), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[8:], dense_reference(q[8:], k, v, 8), atol=1e-5, rtol=1e-5)
