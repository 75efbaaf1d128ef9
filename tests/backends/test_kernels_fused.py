"""The fused layer steps (csrc/lc_fused.h) against the torch ops they replace: RMSNorm (with the residual
add), SwiGLU, and RoPE + KV write + decode attention.

The C steps copy the torch ops' bfloat16 roundings, so in bfloat16 they agree bit for bit except where
a float32 sum taken in a different order lands on the other side of a rounding boundary: at most one
bfloat16 step (2^-7 relative, up to 2^-6 just above a power of two), and only on a small share of
values: at least 98% must be identical, so a kernel that skipped one of the torch path's roundings
fails. float32 agrees up to summation order (1e-5 relative).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from localchat.backends.torch import layers
from localchat.backends.torch.attention import (
    AttentionMetadata,
    AttentionOptions,
    paged_attention,
    rope_paged_attention,
)
from localchat.backends.torch.cpu import kernels
from localchat.backends.torch.kv_cache import Int8KVCache, quantize_rows
from localchat.errors import BackendUnavailableError
from tests.helpers.paged_batches import make_batch
from tests.helpers.torch_batch import PagedDriver
from tests.helpers.torch_models import bundle_from_hf, fp32_runner, tiny_hf_model

ISAS = kernels.runnable_isas()
pytestmark = pytest.mark.skipif(not ISAS, reason="localchat's CPU kernels are not built")
BLOCK = 16
DTYPES = [torch.float32, torch.bfloat16]


def assert_tracks(fused: torch.Tensor, plain: torch.Tensor) -> None:
    """Equal up to summation order: bf16 mostly identical (>= 98% of values) and within one step."""
    assert fused.dtype == plain.dtype and fused.shape == plain.shape
    if fused.dtype == torch.bfloat16:
        same = (fused == plain).float().mean().item()
        assert same >= 0.98, f"only {same:.1%} of values identical"
        torch.testing.assert_close(fused.float(), plain.float(), atol=1e-6, rtol=2**-6)
    else:
        torch.testing.assert_close(fused, plain, atol=1e-5, rtol=1e-5)


def both_paths(monkeypatch: pytest.MonkeyPatch, isa: str, fn):  # type: ignore[no-untyped-def]
    """fn() with the kernels for `isa`, then with them off (the torch ops)."""
    monkeypatch.setenv(kernels.KERNELS_ENV, isa)
    fused = fn()
    monkeypatch.setenv(kernels.KERNELS_ENV, "off")
    return fused, fn()


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("rows", "n"), [(1, 576), (7, 2048), (300, 960), (3, 64)])
@pytest.mark.parametrize("weighted", [True, False])
def test_rms_norm_matches_torch(
    monkeypatch: pytest.MonkeyPatch, isa: str, dtype: torch.dtype, rows: int, n: int, weighted: bool
) -> None:
    gen = torch.Generator().manual_seed(rows * n)
    x = (torch.randn(rows, n, generator=gen) * 3).to(dtype)
    w = (torch.rand(n, generator=gen) + 0.5).to(dtype) if weighted else None
    fused, plain = both_paths(monkeypatch, isa, lambda: layers.rms_norm(x, w, 1e-5))
    assert_tracks(fused, plain)
    ref = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-5)
    ref = ref if w is None else ref * w.double()
    tol = 2**-6 if dtype == torch.bfloat16 else 1e-6
    torch.testing.assert_close(fused.double(), ref, atol=1e-6, rtol=tol)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm_writes_the_sum_and_normalizes_it(
    monkeypatch: pytest.MonkeyPatch, isa: str, dtype: torch.dtype
) -> None:
    gen = torch.Generator().manual_seed(5)
    x, delta = torch.randn(4, 576, generator=gen).to(dtype), torch.randn(4, 576, generator=gen).to(dtype)
    w = torch.rand(576, generator=gen).to(dtype)
    fused, plain = both_paths(monkeypatch, isa, lambda: layers.add_rms_norm(x, delta.clone(), w, 1e-6))
    # the sum is one rounding of an exact float32 sum on both paths: identical
    assert torch.equal(fused[0], x + delta) and torch.equal(plain[0], x + delta)
    assert_tracks(fused[1], plain[1])


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 5, 200])
def test_swiglu_matches_torch(
    monkeypatch: pytest.MonkeyPatch, isa: str, dtype: torch.dtype, rows: int
) -> None:
    gen = torch.Generator().manual_seed(rows)
    gate_up = (torch.randn(rows, 2 * 1536, generator=gen) * 4).to(dtype)
    fused, plain = both_paths(monkeypatch, isa, lambda: layers.swiglu(gate_up))
    assert_tracks(fused, plain)


def rope_tables(
    positions: np.ndarray, head_dim: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed sin [T, 1, d] as layers.Rotary builds them (base 10000)."""
    inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    freqs = torch.from_numpy(positions).float()[:, None] * inv[None, :]
    cos, sin = freqs.cos(), freqs.sin()
    return (
        torch.cat((cos, cos), -1)[:, None, :].to(dtype),
        torch.cat((-sin, sin), -1)[:, None, :].to(dtype),
    )


class DecodeStep:
    """A decode step's projections over a random paged cache (shuffled block tables)."""

    def __init__(self, lengths: list[int], kv_heads: int, group: int, head_dim: int, dtype: torch.dtype,
                 prefill: int = 0) -> None:  # fmt: skip
        rows = [(n, 1) for n in lengths] + ([(prefill, prefill)] if prefill else [])
        blocks = sum(-(-n // BLOCK) for n, _ in rows) + 3
        self.batch = make_batch(rows, BLOCK, blocks, seed=len(lengths) * 7 + head_dim)
        gen = torch.Generator().manual_seed(kv_heads * 100 + group)
        self.cache = torch.randn(2, kv_heads, blocks * BLOCK, head_dim, generator=gen).to(dtype)
        tokens, heads = self.batch.num_tokens, kv_heads * group
        # qk and v as views of one qkv projection, as the Llama layer slices them (strided rows)
        self.qkv = torch.randn(tokens, heads + 2 * kv_heads, head_dim, generator=gen).to(dtype)
        self.heads, self.kv_heads = heads, kv_heads
        self.cos, self.sin = rope_tables(self.batch.positions, head_dim, dtype)

    def run(self, cache: torch.Tensor | Int8KVCache, options: AttentionOptions | None = None,
            cos: torch.Tensor | None = None, sin: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        meta = AttentionMetadata.from_batch(self.batch, torch.device("cpu"), self.kv_heads)
        qk, v = self.qkv[:, : self.heads + self.kv_heads], self.qkv[:, self.heads + self.kv_heads :]
        cos = self.cos if cos is None else cos
        sin = self.sin if sin is None else sin
        return rope_paged_attention(qk, v, cos, sin, cache, meta, options)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lengths", [[37], [1], [300, 17, 64, 5, 129]])
@pytest.mark.parametrize(("group", "head_dim"), [(1, 64), (3, 64), (4, 128)])
def test_rope_attention_matches_rope_then_paged_attention(
    monkeypatch: pytest.MonkeyPatch,
    isa: str,
    dtype: torch.dtype,
    lengths: list[int],
    group: int,
    head_dim: int,
) -> None:
    step = DecodeStep(lengths, 2, group, head_dim, dtype)
    caches = [step.cache.clone(), step.cache.clone()]
    calls: list[int] = []
    fused_call = kernels.Kernels.decode_rope_attention

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        return fused_call(*args, **kwargs)

    monkeypatch.setattr(kernels.Kernels, "decode_rope_attention", counted)
    each = iter(caches)
    fused, plain = both_paths(monkeypatch, isa, lambda: step.run(next(each)))
    assert calls == [1], "the fused kernel must serve a CPU decode step"
    assert_tracks(fused, plain)
    # this step's rotated keys and values were written at their slots, as write_kv writes them
    assert_tracks(caches[0], caches[1])
    slots = torch.from_numpy(step.batch.slot_mapping.astype(np.int64))
    assert not torch.equal(caches[0][:, :, slots], step.cache[:, :, slots])


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_attention_takes_the_layer_options(
    monkeypatch: pytest.MonkeyPatch, isa: str, dtype: torch.dtype
) -> None:
    """Window, soft-cap and score scale (Gemma-style, Mistral's window) reach the fused kernel."""
    step = DecodeStep([300, 7, 64, 33], 2, 4, 64, dtype)
    step.qkv *= 3  # large scores, so the cap matters
    options = AttentionOptions(window=40, softcap=1.5, scale=0.2)
    each = iter([step.cache.clone(), step.cache.clone()])
    fused, plain = both_paths(monkeypatch, isa, lambda: step.run(next(each), options))
    assert_tracks(fused, plain)


def test_steps_the_kernel_does_not_serve_take_the_torch_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    """A prefill row in the step, an int8 cache, partial rotary: same answer as RoPE + paged_attention."""
    monkeypatch.setattr(kernels.Kernels, "decode_rope_attention", None)  # any call would fail
    step = DecodeStep([40, 9], 2, 2, 64, torch.float32, prefill=20)
    expected_cache = step.cache.clone()
    qk = layers.apply_rope(step.qkv[:, :6], step.cos, step.sin)
    meta = AttentionMetadata.from_batch(step.batch, torch.device("cpu"), 2)
    expected = paged_attention(qk[:, :4], qk[:, 4:], step.qkv[:, 6:], expected_cache, meta)
    cache = step.cache.clone()
    torch.testing.assert_close(step.run(cache), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cache, expected_cache)

    decode = DecodeStep([40, 9], 2, 2, 64, torch.float32)
    meta = AttentionMetadata.from_batch(decode.batch, torch.device("cpu"), 2)

    def int8_cache() -> Int8KVCache:
        codes, scales = quantize_rows(decode.cache)
        return Int8KVCache(codes, scales)

    qk = layers.apply_rope(decode.qkv[:, :6], decode.cos, decode.sin)
    expected = paged_attention(qk[:, :4], qk[:, 4:], decode.qkv[:, 6:], int8_cache(), meta)
    torch.testing.assert_close(decode.run(int8_cache()), expected)

    narrow_cos, narrow_sin = decode.cos[..., :32].contiguous(), decode.sin[..., :32].contiguous()
    qk = layers.apply_rope(decode.qkv[:, :6], narrow_cos, narrow_sin)
    expected = paged_attention(qk[:, :4], qk[:, 4:], decode.qkv[:, 6:], decode.cache.clone(), meta)
    torch.testing.assert_close(decode.run(decode.cache.clone(), cos=narrow_cos, sin=narrow_sin), expected)


def test_rejects_slots_outside_the_cache() -> None:
    ops = kernels.load("portable")
    assert ops is not None
    cache = torch.zeros(2, 1, 4 * BLOCK, 64)
    qkv = torch.zeros(1, 4, 64)
    cos, sin = torch.ones(1, 1, 64), torch.zeros(1, 1, 64)
    table, lens = torch.tensor([[0]]), torch.tensor([1])
    with pytest.raises(BackendUnavailableError, match="decode-attention kernel rejected"):
        ops.decode_rope_attention(qkv[:, :3], qkv[:, 3:], cos, sin, cache, torch.tensor([4 * BLOCK]), table, lens,
                                  BLOCK, 0.125)  # fmt: skip
    assert cache.abs().sum() == 0  # nothing written before the refusal


@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_tiny_model_decode_runs_fused_and_matches_the_torch_ops(
    monkeypatch: pytest.MonkeyPatch, model_type: str
) -> None:
    """A whole model (fp32): greedy decode steps through the fused kernels give the torch ops' logits."""
    hf = tiny_hf_model(model_type)
    bundle = bundle_from_hf(hf)
    calls = {"attention": 0, "norm": 0}
    attention, norm = kernels.Kernels.decode_rope_attention, kernels.Kernels.rms_norm

    def count(key, fn):  # type: ignore[no-untyped-def]
        def wrapped(*args, **kwargs):  # type: ignore[no-untyped-def]
            calls[key] += 1
            return fn(*args, **kwargs)

        return wrapped

    monkeypatch.setattr(kernels.Kernels, "decode_rope_attention", count("attention", attention))
    monkeypatch.setattr(kernels.Kernels, "rms_norm", count("norm", norm))

    def decode_logits() -> torch.Tensor:
        driver = PagedDriver(fp32_runner(bundle))
        driver.add("a", [5, 17, 99, 3, 250, 42])
        _, logits = driver.step_logits()
        out = []
        for _ in range(4):
            driver.feed("a", int(logits[-1].argmax()))
            _, logits = driver.step_logits()
            out.append(logits[-1])
        return torch.stack(out)

    fused, plain = both_paths(monkeypatch, "auto", decode_logits)
    layers_count = len(hf.model.layers)
    assert calls["attention"] == 4 * layers_count  # every decode step, every layer
    assert calls["norm"] > 0
    torch.testing.assert_close(fused, plain, atol=1e-4, rtol=0)
