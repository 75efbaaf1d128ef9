"""Prefill SDPA pads lengths to multiples of 64 on CPU (bounded per-shape state) without changing results."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from localchat.backends.torch.cpu import padded_sdpa
from localchat.backends.torch.cpu.padded_sdpa import prefill_sdpa


def _inputs(heads: int, q_len: int, k_len: int, d: int = 16) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(q_len * 1000 + k_len)
    return tuple(torch.randn(heads, n, d, generator=g) for n in (q_len, k_len, k_len))


@pytest.mark.parametrize("length", [2, 63, 64, 65, 130])
def test_causal_prefill_matches_unpadded_sdpa(length: int) -> None:
    q, k, v = _inputs(4, length, length)
    want = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True)[0]
    got = prefill_sdpa(q, k, v, None)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("q_len", "k_len"), [(3, 40), (17, 100), (64, 129), (70, 70)])
@pytest.mark.parametrize("scale", [None, 0.3])
def test_masked_prefill_matches_unpadded_sdpa(q_len: int, k_len: int, scale: float | None) -> None:
    q, k, v = _inputs(2, q_len, k_len)
    q_pos = torch.arange(k_len - q_len, k_len)[:, None]
    k_pos = torch.arange(k_len)[None, :]
    mask = (k_pos <= q_pos) & (k_pos > q_pos - 20)  # a cached prefix and a 20-token window
    want = F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask, scale=scale)[0]
    got = prefill_sdpa(q, k, v, mask, scale)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_sdpa_only_sees_padded_shapes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The point of the module: every call reaches the flash kernel with lengths from a small set."""
    shapes: list[tuple[int, int]] = []
    real = F.scaled_dot_product_attention

    def recording(q: torch.Tensor, k: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        shapes.append((q.shape[-2], k.shape[-2]))
        return real(q, k, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(padded_sdpa.F, "scaled_dot_product_attention", recording)
    for length in range(2, 200, 7):
        q, k, v = _inputs(2, length, length)
        prefill_sdpa(q, k, v, None)
        prefill_sdpa(q[:, -1:].expand(2, 2, 16), k, v, torch.ones(2, length, dtype=torch.bool))
    assert shapes and all(a % 64 == 0 and b % 64 == 0 for a, b in shapes), shapes
    assert len(set(shapes)) <= 8
