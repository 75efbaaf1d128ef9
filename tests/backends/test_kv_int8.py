"""`--kv-cache-dtype int8` (localchat/backends/torch/kv_cache.py): quantization, and every attention
read path over an int8 cache.

Bounds:
- Round trip: scale = max|x| / 127 per (token, head) row and code = round(x / scale), so each value is
  off by at most scale / 2 = max|x| / 254 (plus float32 rounding of x / scale and code * scale, a few
  ulps of max|x|: 1e-6 relative is ample).
- Reading: every path (the fused C kernel on each ISA, the pure-torch gather, the single-stream slice,
  windowed / soft-capped layers, prefill over a cached prefix) must see exactly code * scale. Against a
  float64 attention over the dequantized cache (a fresh prefill row, with nothing cached, attends to
  its own unquantized K/V, as before) they differ only by float32 summation, < 2e-5 on
  unit-scale data (the float32 tests of test_kernels_attention.py hold 1e-5 with the same shapes).
- Against a float32 cache holding the unquantized values: with scores perturbed by at most
  e = scale * sum|q| * dk (dk, dv: the largest per-value error of K and V), the softmax weights move
  by a factor within exp(+-2e), so each output moves by at most dv + (exp(2e) - 1) * max|v|. The test
  computes that bound per (row, head) and also checks the error is not zero (the int8 cache is used).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from localchat.backends.torch.attention import AttentionMetadata, AttentionOptions, paged_attention, write_kv
from localchat.backends.torch.cpu import kernels
from localchat.backends.torch.kv_cache import Int8KVCache, dequantize, quantize_rows
from tests.helpers.paged_batches import make_batch

BLOCK = 16
HEAD_DIM = 64
KV_HEADS, GROUP = 2, 3
MODES = ["off", *kernels.runnable_isas()]  # the pure-torch path, then the C kernel on each ISA
RAGGED = [1, 16, 17, 300, 31, 64, 129, 2, 250, 48, 5, 200, 33, 99, 160, 7]  # block edges and between


def test_round_trip_error_is_within_half_a_step() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, HEAD_DIM, generator=gen)
    # Extreme and mixed row scales; one all-zero row and one row with a single nonzero value.
    x *= torch.logspace(-6, 4, 64)[:, None, None]
    x[3, 1] = 0.0
    x[5, 2] = 0.0
    x[5, 2, 7] = -2.5
    codes, scales = quantize_rows(x)
    assert codes.dtype == torch.int8 and scales.dtype == torch.float32 and scales.shape == x.shape[:-1]
    err = (dequantize(codes, scales) - x).abs()
    bound = x.abs().amax(-1, keepdim=True) / 254 * (1 + 1e-6)
    assert (err <= bound).all()
    assert (codes.abs() <= 127).all() and (codes.abs().amax(-1) == 127).sum() == 64 * 4 - 1
    assert (dequantize(codes, scales)[3, 1] == 0).all() and dequantize(codes, scales)[5, 2, 7] == -2.5


def test_write_then_gather_round_trip() -> None:
    """write_kv quantizes into the slots named; gather returns them dequantized, untouched slots zero."""
    from localchat.backends.torch.attention import gather_blocks

    gen = torch.Generator().manual_seed(1)
    cache = Int8KVCache(torch.zeros(2, KV_HEADS, 8 * BLOCK, HEAD_DIM, dtype=torch.int8),
                        torch.zeros(2, KV_HEADS, 8 * BLOCK))  # fmt: skip
    k, v = (
        torch.randn(20, KV_HEADS, HEAD_DIM, generator=gen),
        torch.randn(20, KV_HEADS, HEAD_DIM, generator=gen),
    )
    slots = torch.cat([torch.arange(5 * BLOCK, 6 * BLOCK), torch.arange(2 * BLOCK, 2 * BLOCK + 4)])
    write_kv(k, v, cache, slots)
    got = gather_blocks(cache, torch.tensor([5, 2]), BLOCK)  # [2, kvh, 32, d]
    for i, x in enumerate((k, v)):
        ref = x.transpose(0, 1)  # [kvh, 20, d]
        bound = ref.abs().amax(-1, keepdim=True) / 254 * (1 + 1e-6)
        assert ((got[i, :, :20] - ref).abs() <= bound).all()
        assert (got[i, :, 20:] == 0).all()


class Case:
    """One step through paged_attention over the same K/V stored in a float32 and in an int8 cache.

    rows: (context length after the step, new tokens). Earlier positions are written first, as earlier
    steps would have; the step's own K/V go through paged_attention (which writes them)."""

    def __init__(self, rows: list[tuple[int, int]], options: AttentionOptions | None = None,
                 consecutive: bool = False, seed: int = 0, dtype: torch.dtype = torch.float32) -> None:  # fmt: skip
        blocks = sum(-(-n // BLOCK) for n, _ in rows) + 2
        batch = make_batch(rows, BLOCK, blocks, seed=seed)
        if consecutive:  # one row over blocks 1, 2, ...: the single-stream slice path
            assert len(rows) == 1
            width = batch.block_tables.shape[1]
            batch.block_tables[0] = np.arange(1, width + 1)
            batch.slot_mapping = batch.positions + BLOCK
        gen = torch.Generator().manual_seed(seed + 7)
        total = sum(n for n, _ in rows)
        # Per-token magnitudes that vary, so each row's scale matters.
        k = torch.randn(total, KV_HEADS, HEAD_DIM, generator=gen) * torch.rand(
            total, KV_HEADS, 1, generator=gen
        )
        v = torch.randn(total, KV_HEADS, HEAD_DIM, generator=gen) * (
            0.5 + torch.rand(total, KV_HEADS, 1, generator=gen)
        )
        q = torch.randn(sum(m for _, m in rows), KV_HEADS * GROUP, HEAD_DIM, generator=gen)
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)  # bf16: the compute dtype of CPUs with native bf16
        slots_all, new_idx, starts, first = [], [], [], 0
        for i, (n, m) in enumerate(rows):
            pos = np.arange(n)
            slots_all.append(batch.block_tables[i][pos // BLOCK] * BLOCK + pos % BLOCK)
            new_idx.extend(range(first + n - m, first + n))
            starts.append(first)
            first += n
        slots = torch.from_numpy(np.concatenate(slots_all).astype(np.int64))
        old = torch.tensor(sorted(set(range(total)) - set(new_idx)), dtype=torch.int64)
        new = torch.tensor(new_idx, dtype=torch.int64)
        self.fp32 = torch.zeros(2, KV_HEADS, blocks * BLOCK, HEAD_DIM, dtype=dtype)
        self.int8 = Int8KVCache(torch.zeros(2, KV_HEADS, blocks * BLOCK, HEAD_DIM, dtype=torch.int8),
                                torch.zeros(2, KV_HEADS, blocks * BLOCK))  # fmt: skip
        for cache in (self.fp32, self.int8):
            if old.numel():
                write_kv(k[old], v[old], cache, slots[old])
        self.meta = AttentionMetadata.from_batch(batch, torch.device("cpu"), KV_HEADS)
        if consecutive:
            assert self.meta.decode_span is not None
        self.rows, self.q, self.k, self.v, self.slots, self.starts = rows, q, k, v, slots, starts
        self.options = options
        self.out_fp32 = paged_attention(q, k[new], v[new], self.fp32, self.meta, options)
        self.out_int8 = paged_attention(q, k[new], v[new], self.int8, self.meta, options)

    def reference(self) -> torch.Tensor:
        """float64 attention over the dequantized int8 cache: what every int8 path must compute."""
        deq = dequantize(self.int8.codes, self.int8.scales).double()
        out, qi = [], 0
        opts = self.options or AttentionOptions()
        for (n, m), start in zip(self.rows, self.starts, strict=True):
            if n == m > 1:  # a prefill with nothing cached attends to its own unquantized K/V, not the cache
                kv = (
                    torch.stack([self.k[start : start + n], self.v[start : start + n]])
                    .transpose(1, 2)
                    .double()
                )
            else:
                kv = deq[:, :, self.slots[start : start + n]]  # [2, kvh, n, d]
            keys, values = kv[0].repeat_interleave(GROUP, 0), kv[1].repeat_interleave(GROUP, 0)
            q = self.q[qi : qi + m].double().transpose(0, 1)  # [heads, m, d]
            scale = opts.scale if opts.scale is not None else 1 / math.sqrt(HEAD_DIM)
            scores = q @ keys.transpose(1, 2) * scale  # [heads, m, n]
            if opts.softcap:
                scores = opts.softcap * torch.tanh(scores / opts.softcap)
            q_pos = torch.arange(n - m, n)[:, None]
            k_pos = torch.arange(n)[None, :]
            mask = k_pos <= q_pos
            if opts.window:
                mask &= k_pos > q_pos - opts.window
            out.append((scores.masked_fill(~mask, -math.inf).softmax(-1) @ values).transpose(0, 1))
            qi += m
        return torch.cat(out)

    def fp32_bound(self) -> torch.Tensor:
        """Per (token, head): dv + (exp(2e) - 1) * max|v| (module docstring), over the whole context
        (a safe over-estimate for windowed rows)."""
        k_err = (dequantize(self.int8.codes[0], self.int8.scales[0]) - self.fp32[0]).abs().max()
        v_err = (dequantize(self.int8.codes[1], self.int8.scales[1]) - self.fp32[1]).abs().max()
        scale = (self.options.scale if self.options and self.options.scale else None) or 1 / math.sqrt(
            HEAD_DIM
        )
        e = scale * self.q.abs().sum(-1, keepdim=True) * k_err  # [T, heads, 1]
        return v_err + torch.expm1(2 * e) * self.fp32[1].abs().max() + 1e-5


def _cases() -> dict[str, tuple[list[tuple[int, int]], AttentionOptions | None, bool]]:
    return {
        "decode-1": ([(37 + 150, 1)], None, False),
        "decode-1-slice": ([(200, 1)], None, True),
        "decode-16-ragged": ([(n, 1) for n in RAGGED], None, False),
        "prefill-cached-prefix": ([(40, 7), (33, 17), (16, 16)], None, False),
        "mixed": ([(65, 1), (48, 16), (17, 1), (100, 9)], None, False),
        "windowed-decode": ([(n, 1) for n in RAGGED[:8]], AttentionOptions(window=24, softcap=30.0, scale=0.1), False),
        "windowed-prefill": ([(70, 12), (20, 1), (33, 33)], AttentionOptions(window=24, softcap=None), False),
        "softcap-prefill": ([(50, 5), (9, 1)], AttentionOptions(softcap=20.0), False),
    }  # fmt: skip


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(_cases()))
def test_int8_attention_reads_code_times_scale(name: str, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCALCHAT_KERNELS", mode)
    rows, options, consecutive = _cases()[name]
    case = Case(rows, options, consecutive, seed=len(name))
    if mode != "off" and any(m == 1 for _, m in rows):
        assert case.meta.cpu_kernels is not None and case.meta.cpu_kernels.name == mode
    assert case.out_int8.dtype == torch.float32
    assert (case.out_int8.double() - case.reference()).abs().max().item() < 2e-5


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(_cases()))
def test_int8_attention_tracks_float32_cache(name: str, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCALCHAT_KERNELS", mode)
    rows, options, consecutive = _cases()[name]
    case = Case(rows, options, consecutive, seed=len(name))
    err = (case.out_int8 - case.out_fp32).abs()
    assert (err <= case.fp32_bound()).all()
    if any(n > m for n, m in rows):  # some keys came from the cache: int8 must show
        assert err.max().item() > 1e-6


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["decode-1", "decode-1-slice", "decode-16-ragged", "windowed-decode"])
def test_int8_attention_with_bf16_queries(name: str, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """bf16 compute (q, k, v and the output in bf16) over an int8 cache: the same exact reads, then the
    output rounded to bf16: within one bf16 step (2^-8 relative, 2^-7 at a binade edge) of the float64
    reference over the dequantized cache."""
    monkeypatch.setenv("LOCALCHAT_KERNELS", mode)
    rows, options, consecutive = _cases()[name]
    case = Case(rows, options, consecutive, seed=len(name), dtype=torch.bfloat16)
    assert case.out_int8.dtype == torch.bfloat16
    ref = case.reference()
    assert ((case.out_int8.double() - ref).abs() <= ref.abs() * 2**-7 + 1e-5).all()
