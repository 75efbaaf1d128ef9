"""Gated DeltaNet's per-position states of a speculative verify row (engine/hybrid_spec.py): the C step
(lc_deltanet_step_keep) against the torch forms (StepRows.verify, token by token in the decode form) on
every ISA this CPU runs, and the torch forms against plain one-token decode steps. A verify row of the
last token and 4 drafts in slot 1 beside two decode rows; spec rows 5..8 must hold the row's conv window
and state after its first 1..4 tokens, the live slot the state after all 5. Bounds as
test_deltanet_kernel.py's (the C step runs a verify row with the decode numerics: bfloat16 included)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from localchat.backends.torch.cpu import kernels
from localchat.backends.torch.models.qwen3_next import HybridLayer
from localchat.backends.torch.state_cache import StateCache, StepRows
from localchat.kernels import library
from tests.backends.test_deltanet_kernel import ISAS, SHAPES, assert_close, clone, make_layer, rows_of

pytestmark = pytest.mark.skipif(
    not ISAS or not hasattr(library.library(), "lc_deltanet_step_keep"),
    reason="localchat's CPU kernels are not built (or built before lc_deltanet_step_keep)",
)

SLOTS = np.array([3, 1, 0], dtype=np.int64)  # decode, verify (5 tokens), decode
QSL = np.array([0, 1, 6, 7], dtype=np.int64)
KEEP = np.array([-1, 5, 6, 7, 8, -1, -1], dtype=np.int64)


def pool(layer: HybridLayer, dtype: torch.dtype) -> StateCache:
    cache = StateCache([layer.state_shape()], 10, dtype, lambda shape, dt: torch.zeros(shape, dtype=dt))
    gen = torch.Generator().manual_seed(1)
    cache.conv[0][:5].copy_(torch.randn(cache.conv[0][:5].shape, generator=gen))
    cache.recurrent[0][:5].copy_(torch.randn(cache.recurrent[0][:5].shape, generator=gen) * 0.1)
    return cache


def verify_rows() -> StepRows:
    positions = np.arange(7, dtype=np.int64) + 20  # none at 0: no slot is reset
    return StepRows.from_batch(SLOTS, QSL, positions, torch.device("cpu"), KEEP)


def spans() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.from_numpy(QSL.copy()), torch.from_numpy(SLOTS.copy())


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
def test_verify_row_keeps_each_positions_state(
    monkeypatch: pytest.MonkeyPatch, isa: str, dtype: torch.dtype, shape: tuple[int, int, int, int]
) -> None:
    layer = make_layer(*shape, dtype)
    cache = pool(layer, dtype)
    ref_cache = clone(cache)
    x = torch.randn(7, 128, generator=torch.Generator().manual_seed(2)).to(dtype)
    rows = verify_rows()
    assert rows.prefills == [] and rows.verify == [(1, 6, 1, [5, 6, 7, 8, -1])]
    with torch.no_grad():
        monkeypatch.setenv(kernels.KERNELS_ENV, isa)
        ours = layer.linear_attention(x, rows, cache, 0, spans())
        monkeypatch.setenv(kernels.KERNELS_ENV, "off")
        ref = layer.linear_attention(x, rows, ref_cache, 0, spans())
    bf16 = dtype == torch.bfloat16
    assert_close(ours, ref, bf16)
    torch.testing.assert_close(cache.conv[0], ref_cache.conv[0], rtol=0, atol=0)
    assert_close(cache.recurrent[0], ref_cache.recurrent[0], bf16, state=True)
    assert (cache.recurrent[0][9] == 0).all() and (cache.conv[0][9] == 0).all()  # no spec row past the 4th


@pytest.mark.parametrize("shape", SHAPES)
def test_torch_verify_states_equal_one_token_decode_steps(
    monkeypatch: pytest.MonkeyPatch, shape: tuple[int, int, int, int]
) -> None:
    """The reference itself: the spec rows hold what plain decoding's states would be after each token
    (a state one position off differs by whole units)."""
    monkeypatch.setenv(kernels.KERNELS_ENV, "off")
    layer = make_layer(*shape, torch.float32)
    cache = pool(layer, torch.float32)
    plain = clone(cache)
    x = torch.randn(7, 128, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = layer.linear_attention(x, verify_rows(), cache, 0)
        for j in range(5):  # the verify row's tokens as one-token decode steps of slot 1
            one = layer.linear_attention(x[1 + j : 2 + j], rows_of([1]), plain, 0)
            # (the projections' matmuls over 7 rows and over 1 round differently: float32 bounds)
            assert_close(out[1 + j : 2 + j], one, bf16=False)
            row = 5 + j if j < 4 else 1
            assert_close(cache.recurrent[0][row], plain.recurrent[0][1], bf16=False)
            assert_close(cache.conv[0][row], plain.conv[0][1], bf16=False)
