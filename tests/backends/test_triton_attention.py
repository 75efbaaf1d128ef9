"""The CUDA paged-attention kernels, run by Triton's interpreter on CPU tensors, against the CPU path.

CI has no GPU: `TRITON_INTERPRET=1` executes the same kernel code with numpy, so indexing, masking,
the online softmax, GQA grouping and split-K merging are all checked here; only speed needs a GPU
(benchmarks/gpu_check.sh). Shapes are tiny so the interpreter takes seconds.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton decorates the kernels

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from localchat.backends.torch.attention import AttentionMetadata, AttentionOptions, paged_attention  # noqa: E402
from localchat.backends.torch.cuda.gpu_attention_meta import BLOCK_N, TritonAttentionMetadata, pick_num_splits  # noqa: E402
from localchat.backends.torch.cuda.triton_attention import triton_paged_attention  # noqa: E402
from tests.helpers.paged_batches import make_batch  # noqa: E402

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="needs Triton's interpreter (set before import)"
)


def run_both(
    rows: list[tuple[int, int]],
    *,
    heads: int,
    kv_heads: int,
    head_dim: int,
    block_size: int,
    splits: int | None = None,
    options: AttentionOptions | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    num_blocks = sum(-(-seq // block_size) for seq, _ in rows) + 3
    batch = make_batch(rows, block_size, num_blocks)
    gen = torch.Generator().manual_seed(1)
    tokens = batch.num_tokens
    q = torch.randn(tokens, heads, head_dim, generator=gen)
    k = torch.randn(tokens, kv_heads, head_dim, generator=gen)
    v = torch.randn(tokens, kv_heads, head_dim, generator=gen)
    # Earlier steps' K/V (the cached prefixes) are random too; this step overwrites its own slots.
    cache = torch.randn(2, kv_heads, num_blocks * block_size, head_dim, generator=gen)
    cpu_cache = cache.clone()
    cpu_meta = AttentionMetadata.from_batch(batch, q.device, kv_heads)
    expected = paged_attention(q, k, v, cpu_cache, cpu_meta, options)
    meta = TritonAttentionMetadata.from_batch(batch, q.device, kv_heads)
    if splits is not None:
        meta.num_splits = splits
        per_split = -(-batch.max_seq_len // splits)
        meta.tokens_per_split = -(-per_split // BLOCK_N) * BLOCK_N
    got = triton_paged_attention(q, k, v, cache, meta, options)
    assert torch.equal(cache, cpu_cache), "both paths write this step's K/V to the same slots"
    return got, expected


@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 2), (4, 4), (6, 1)])
def test_ragged_batch_matches_cpu_path(heads: int, kv_heads: int) -> None:
    # A decode row, a fresh prefill, a chunk after a cached prefix, a short decode, a 1-token prefill.
    rows = [(37, 1), (13, 13), (80, 35), (5, 1), (9, 9)]
    got, expected = run_both(rows, heads=heads, kv_heads=kv_heads, head_dim=16, block_size=4)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=2e-5)


def test_head_dim_not_a_power_of_two_and_block_size_16() -> None:
    got, expected = run_both([(70, 1), (40, 22)], heads=4, kv_heads=2, head_dim=24, block_size=16)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("splits", [2, 4])
def test_split_k_decode_merges_exactly(splits: int) -> None:
    # Long contexts, few rows: the case split-K is for. The last split of the short row is empty.
    rows = [(300, 1), (70, 1)]
    got, expected = run_both(rows, heads=4, kv_heads=2, head_dim=16, block_size=8, splits=splits)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=2e-5)


def test_prefill_longer_than_one_tile_with_cached_prefix() -> None:
    # 70 new queries span three 32-query tiles; 30 cached tokens come before them.
    got, expected = run_both([(100, 70)], heads=2, kv_heads=1, head_dim=16, block_size=16)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=2e-5)


def test_bf16_cache_close_to_float32_reference() -> None:
    rows = [(37, 1), (50, 20)]
    batch = make_batch(rows, 4, 40)
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(batch.num_tokens, 4, 16, generator=gen)
    k = torch.randn(batch.num_tokens, 2, 16, generator=gen)
    v = torch.randn(batch.num_tokens, 2, 16, generator=gen)
    cache = torch.randn(2, 2, 160, 16, generator=gen)
    expected = paged_attention(q, k, v, cache.clone(), AttentionMetadata.from_batch(batch, q.device, 2))
    meta = TritonAttentionMetadata.from_batch(batch, q.device, 2)
    got = triton_paged_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), cache.bfloat16(), meta).float()
    torch.testing.assert_close(got, expected, atol=3e-2, rtol=3e-2)


def test_bf16_cache_with_window_and_softcap_close_to_float32_reference() -> None:
    rows = [(37, 1), (50, 20)]
    batch = make_batch(rows, 4, 40)
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(batch.num_tokens, 4, 16, generator=gen)
    k = torch.randn(batch.num_tokens, 2, 16, generator=gen)
    v = torch.randn(batch.num_tokens, 2, 16, generator=gen)
    cache = torch.randn(2, 2, 160, 16, generator=gen)
    options = AttentionOptions(window=9, softcap=3.0, scale=0.2)
    cpu_meta = AttentionMetadata.from_batch(batch, q.device, 2)
    expected = paged_attention(q, k, v, cache.clone(), cpu_meta, options)
    meta = TritonAttentionMetadata.from_batch(batch, q.device, 2)
    bf16 = [t.bfloat16() for t in (q, k, v, cache)]
    got = triton_paged_attention(*bf16, meta, options).float()
    torch.testing.assert_close(got, expected, atol=3e-2, rtol=3e-2)


def test_split_choice_fills_the_gpu_and_never_splits_short_contexts() -> None:
    assert pick_num_splits(num_rows=1, kv_heads=8, max_seq_len=4096, num_sms=132) == 16
    assert pick_num_splits(num_rows=64, kv_heads=8, max_seq_len=4096, num_sms=132) == 1
    assert pick_num_splits(num_rows=1, kv_heads=8, max_seq_len=100, num_sms=132) == 2  # 2 x 64 keys
    assert pick_num_splits(num_rows=1, kv_heads=8, max_seq_len=10, num_sms=132) == 1


# A decode row, a fresh prefill over two tiles, a chunk after a cached prefix, a short decode, a
# 1-token prefill, and a decode row whose context ends exactly at a block boundary.
MIXED = [(37, 1), (45, 45), (80, 35), (5, 1), (9, 9), (48, 1)]


@pytest.mark.parametrize(
    "window",
    [
        1,  # only the query's own key
        4,  # one block: the window starts on a block boundary for some rows, mid-block for others
        7,  # shorter than every multi-token context, mid-block
        33,  # cuts through a 32-query tile and a 64-key step
        64,  # exactly one key step
        200,  # longer than every context: plain causal
    ],
)
def test_sliding_window_matches_cpu_path(window: int) -> None:
    got, expected = run_both(
        MIXED, heads=4, kv_heads=2, head_dim=16, block_size=4, options=AttentionOptions(window=window)
    )
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("softcap", [None, 2.0, 50.0])
@pytest.mark.parametrize("scale", [None, 0.06])
def test_softcap_and_scale_match_cpu_path(softcap: float | None, scale: float | None) -> None:
    # Scores of unit-normal q/k at head_dim 16 reach ~+-15 (x scale): a cap of 2 saturates many.
    options = AttentionOptions(softcap=softcap, scale=scale)
    got, expected = run_both(MIXED, heads=4, kv_heads=1, head_dim=16, block_size=8, options=options)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=2e-5)


def test_gemma_like_options_together_with_a_head_dim_of_24() -> None:
    options = AttentionOptions(window=10, softcap=50.0, scale=24**-0.5 * 0.9)
    got, expected = run_both(MIXED, heads=6, kv_heads=2, head_dim=24, block_size=16, options=options)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize(("window", "splits"), [(50, 4), (130, 2), (300, 4)])
def test_split_k_decode_within_a_window(window: int, splits: int) -> None:
    # The splits share the window's keys only: with a short window most splits are empty.
    rows = [(300, 1), (70, 1), (128, 1)]
    options = AttentionOptions(window=window, softcap=30.0)
    got, expected = run_both(
        rows, heads=4, kv_heads=2, head_dim=16, block_size=8, splits=splits, options=options
    )
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=2e-5)


def test_window_does_not_read_keys_before_it() -> None:
    """Keys older than the window are never loaded: poison them with NaN and the output stays finite
    (a masked-out score of NaN would still poison the softmax sums)."""
    rows = [(90, 1), (70, 40)]
    batch = make_batch(rows, 8, 30)
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(batch.num_tokens, 2, 16, generator=gen)
    k = torch.randn(batch.num_tokens, 1, 16, generator=gen)
    v = torch.randn(batch.num_tokens, 1, 16, generator=gen)
    cache = torch.randn(2, 1, 240, 16, generator=gen)
    window = 12
    for row, (seq, new) in enumerate(rows):
        first_seen = seq - new - window + 1  # the row's first query's first key
        for pos in range(first_seen):
            block = int(batch.block_tables[row, pos // 8])
            cache[:, :, block * 8 + pos % 8] = float("nan")
    meta = TritonAttentionMetadata.from_batch(batch, q.device, 1)
    out = triton_paged_attention(q, k, v, cache, meta, AttentionOptions(window=window))
    assert torch.isfinite(out).all()
