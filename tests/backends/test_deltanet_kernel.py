"""Gated DeltaNet's C step (csrc/lc_deltanet.h via cpu/deltanet_step.py) against the torch forms it replaces
(gated_deltanet.py's conv and delta-rule forms and the gated RMSNorm), through the real layer
(qwen3_next.HybridLayer.linear_attention) on every ISA this CPU runs: the layer's output and the slots'
conv windows and float32 states after 3 steps, decode rows alone and beside a 150-token prefill row.

Bounds: float32 agrees up to summation order (the C step sums k^T S and q^T S in another order and takes
a S inside the product): 1e-4 relative on outputs and states after 3 steps. bfloat16 copies the torch
path's roundings (conv products, sum and silu; the core before the norm; the normalised value before its
weight), so values differ only where a float32 sum in another order crosses a rounding boundary: after the
out projection >= 99% within a few bfloat16 steps (rtol 2^-5), every value within 2^-6 of the output's
largest (a few values near zero after cancellation), the conv windows identical (they hold the inputs),
the float32 states within 1e-3. Prefill rows: the C step runs the exact recurrence where the torch form
solves each 64-token chunk's triangular system, within the same bounds. A missed decay, beta, gate or window shift is off by whole
units."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3_5TextConfig

from localchat.backends.torch.cpu import kernels
from localchat.backends.torch.cpu.deltanet_step import spans_of
from localchat.backends.torch.models.qwen3_next import HybridLayer
from localchat.backends.torch.state_cache import StateCache, StepRows
from localchat.errors import BackendUnavailableError
from localchat.kernels import library
from localchat.weights.config import ModelConfig

ISAS = kernels.runnable_isas()
pytestmark = pytest.mark.skipif(
    not ISAS or not hasattr(library.library(), "lc_deltanet_step"),
    reason="localchat's CPU kernels are not built (or built before lc_deltanet_step)",
)

# (key heads, value heads, key dim, value dim): Qwen3.5-2B's (16, 16, 128, 128) and a grouped tiny one
SHAPES = [(16, 16, 128, 128), (2, 4, 16, 8)]


def make_layer(nk: int, nv: int, dk: int, dv: int, dtype: torch.dtype) -> HybridLayer:
    hf = Qwen3_5TextConfig(
        vocab_size=64, hidden_size=128, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, linear_num_key_heads=nk, linear_num_value_heads=nv,
        linear_key_head_dim=dk, linear_value_head_dim=dv, linear_conv_kernel_dim=4, full_attention_interval=2,
    )  # fmt: skip
    layer = HybridLayer(ModelConfig.from_hf_dict(hf.to_dict()), 0)
    assert layer.linear
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in layer.named_parameters():
            param.copy_(torch.randn(param.shape, generator=gen) * (0.5 if name == "conv" else 0.1))
        layer.A_log.copy_(torch.linspace(-2.0, 2.0, nv))  # decays from ~1 to ~e^-7 a token
        layer.dt_bias.copy_(torch.linspace(-1.0, 1.0, nv))
        layer.gated_norm.add_(1.0)
    return layer.to(dtype)


def states(layer: HybridLayer, dtype: torch.dtype, slots: int = 5) -> StateCache:
    cache = StateCache([layer.state_shape()], slots, dtype, lambda shape, dt: torch.zeros(shape, dtype=dt))
    gen = torch.Generator().manual_seed(1)
    cache.conv[0].copy_(torch.randn(cache.conv[0].shape, generator=gen))
    cache.recurrent[0].copy_(torch.randn(cache.recurrent[0].shape, generator=gen) * 0.1)
    return cache


def clone(cache: StateCache) -> StateCache:
    out = StateCache.__new__(StateCache)
    out.num_slots, out.conv, out.recurrent = (
        cache.num_slots,
        [c.clone() for c in cache.conv],
        [r.clone() for r in cache.recurrent],
    )
    return out


def run(
    monkeypatch: pytest.MonkeyPatch,
    isa: str,
    layer: HybridLayer,
    cache: StateCache,
    xs: list[torch.Tensor],
    rows: StepRows,
) -> list[torch.Tensor]:
    monkeypatch.setenv(kernels.KERNELS_ENV, isa)
    with torch.no_grad():
        return [layer.linear_attention(x, rows, cache, 0) for x in xs]


def rows_of(decode_slots: list[int], prefill: tuple[int, int, int] | None = None) -> StepRows:
    start = 0 if prefill is None else prefill[1]
    tokens = torch.arange(start, start + len(decode_slots))
    return StepRows(tokens, torch.tensor(decode_slots), [] if prefill is None else [prefill], None)


def assert_close(ours: torch.Tensor, ref: torch.Tensor, bf16: bool, state: bool = False) -> None:
    if not bf16:
        torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-5)
    elif state:
        torch.testing.assert_close(ours, ref, rtol=1e-3, atol=1e-3)
    else:  # >= 99% within a few bfloat16 steps of themselves, the rest within 2^-6 of the output's scale
        a, b = ours.float(), ref.float()
        near = ((a - b).abs() <= 2e-3 + 2**-5 * b.abs()).float().mean().item()
        assert near >= 0.99, f"only {near:.1%} of values close"
        assert (a - b).abs().max().item() <= 2**-6 * b.abs().max().item()


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("with_prefill", [False, True])
def test_decode_step_matches_torch_forms(
    monkeypatch: pytest.MonkeyPatch,
    isa: str,
    dtype: torch.dtype,
    shape: tuple[int, int, int, int],
    with_prefill: bool,
) -> None:
    layer = make_layer(*shape, dtype)
    cache = states(layer, dtype)
    # a 150-token row in slot 1 before the decode rows: 3 of the chunked form's chunks, 2 of the C step's
    # 128-token passes
    prefill = (0, 150, 1) if with_prefill else None
    rows = rows_of([3, 0, 4], prefill)
    tokens = 3 + (150 if with_prefill else 0)
    gen = torch.Generator().manual_seed(2)
    xs = [torch.randn(tokens, 128, generator=gen).to(dtype) for _ in range(3)]
    ref_cache = clone(cache)
    ours = run(monkeypatch, isa, layer, cache, xs, rows)
    ref = run(monkeypatch, "off", layer, ref_cache, xs, rows)
    bf16 = dtype == torch.bfloat16
    for a, b in zip(ours, ref, strict=True):
        assert_close(a, b, bf16)
    torch.testing.assert_close(cache.conv[0], ref_cache.conv[0], rtol=0, atol=0)
    assert_close(cache.recurrent[0], ref_cache.recurrent[0], bf16, state=True)
    assert (cache.recurrent[0][2] == states(layer, dtype).recurrent[0][2]).all()  # slot 2 untouched


def test_rejects_a_slot_out_of_range(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bad slot is a typed error from the kernel's checks, not a write outside the pool."""
    layer = make_layer(2, 4, 16, 8, torch.float32)
    cache = states(layer, torch.float32)
    monkeypatch.setenv(kernels.KERNELS_ENV, ISAS[0])
    with pytest.raises(BackendUnavailableError), torch.no_grad():
        layer.linear_attention(torch.zeros(1, 128), rows_of([7]), cache, 0)


def test_rows_that_do_not_cover_the_step_keep_the_torch_forms() -> None:
    """spans_of gives the C step only rows that cover the step's tokens one after another."""
    starts, slots = spans_of(rows_of([3, 0], (0, 4, 1)), 6) or (None, None)
    assert starts is not None and slots is not None
    assert starts.tolist() == [0, 4, 5, 6] and slots.tolist() == [1, 3, 0]
    assert spans_of(rows_of([3, 0], (0, 4, 1)), 7) is None  # a padding token at the end
    assert spans_of(StepRows(torch.tensor([5]), torch.tensor([2]), [(0, 4, 1)], None), 6) is None  # a gap
