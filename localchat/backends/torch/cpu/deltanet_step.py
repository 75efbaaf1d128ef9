"""Gated DeltaNet's conv, delta rule and gated norm for a whole step in one C call (csrc/lc_deltanet.h's
lc_deltanet_step), decode and prefill rows alike.

The torch forms (gated_deltanet.py, then the gated RMSNorm) take ~30 small ops a layer for decode rows
and gather, rescale, read and scatter each row's float32 state; for prefill rows the chunked form's
padded copies, triangular solve and small batched matmuls. The C step runs the recurrence token by token
on each row's conv window and state in place (per head, so a prefill row spreads over the threads) and
returns RMSNorm(o) * silu(z) for every token, ready for out_proj.

The export is looked up by name rather than through library.SIGNATURES: a build from before it keeps
the torch forms instead of failing to load. A step with speculative verify rows of a hybrid model takes
lc_deltanet_step_keep (the same, plus the per-token spec rows that receive each position's state:
engine/hybrid_spec.py); a build without it runs such a step in the torch forms.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from localchat.backends.torch.cpu.kernels import Kernels
from localchat.backends.torch.state_cache import StepRows
from localchat.kernels import library

_I, _P, _L, _F = ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
# as csrc/lc_deltanet.h declares lc_deltanet_step
ARGTYPES = [_I, _P, _L, _I, _L, _P, _P, _P, _I, _L, _L, _L, _P, _P, _L, _L, _L, _L, _P, _P, _P, _F, _P, _I]
KEEP_ARGTYPES = [*ARGTYPES[:-1], _P, _I]  # lc_deltanet_step_keep: keep before nth
MAX_HEAD_DIM = 512  # the kernel's stack buffers


@dataclass(frozen=True, slots=True)
class DeltaNetParams:
    """A layer's small float32 tensors in the kernel's form (made once per layer)."""

    conv: torch.Tensor  # [C, K]
    neg_a: torch.Tensor  # -exp(A_log) [nv]
    dt_bias: torch.Tensor  # [nv]
    norm: torch.Tensor  # [dv]
    k_heads: int
    key_dim: int

    @classmethod
    def of(
        cls,
        conv: torch.Tensor,
        a_log: torch.Tensor,
        dt_bias: torch.Tensor,
        norm: torch.Tensor,
        k_heads: int,
        key_dim: int,
    ) -> DeltaNetParams:
        def f32(t: torch.Tensor) -> torch.Tensor:
            return t.detach().float().contiguous()

        return cls(f32(conv), f32(-a_log.float().exp()), f32(dt_bias), f32(norm), k_heads, key_dim)


def _function(ops: Kernels, keep: bool = False) -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    fn = getattr(ops.lib, "lc_deltanet_step_keep" if keep else "lc_deltanet_step", None)
    if fn is not None and fn.argtypes is None:
        fn.argtypes, fn.restype = KEEP_ARGTYPES if keep else ARGTYPES, _I
    return fn


def available(
    ops: Kernels | None, y: torch.Tensor, conv_state: torch.Tensor, value_dim: int, keep: bool = False
) -> bool:
    """Whether the C step takes this layer's rows: the kernels loaded (with the export; `keep`: the one
    that also keeps verify rows' per-position states), CPU float32 or bfloat16 activations and conv
    windows, head sizes within the kernel's buffers."""
    return (
        ops is not None
        and y.dtype in (torch.float32, torch.bfloat16)
        and conv_state.dtype in (torch.float32, torch.bfloat16)
        and value_dim <= MAX_HEAD_DIM
        and _function(ops, keep) is not None
    )


def spans_of(rows: StepRows, tokens: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(starts int64 [R + 1], slots int64 [R]) of a step's rows in token order, from its StepRows (the
    model passes the batch's own query_start_loc and slots instead, made once per step); None when the
    rows do not cover the step's tokens one after another (the caller keeps the torch forms then)."""
    found = [(start, end, slot) for start, end, slot in rows.prefills]
    if rows.decode_tokens is not None and rows.decode_slots is not None:
        found += [
            (t, t + 1, s)
            for t, s in zip(rows.decode_tokens.tolist(), rows.decode_slots.tolist(), strict=True)
        ]
    found.sort()
    ends = [0] + [end for _, end, _ in found]
    if not found or ends[-1] != tokens or any(start != ends[i] for i, (start, _, _) in enumerate(found)):
        return None
    return torch.tensor(ends, dtype=torch.int64), torch.tensor(
        [slot for _, _, slot in found], dtype=torch.int64
    )


def deltanet_step(
    ops: Kernels,
    y: torch.Tensor,
    spans: tuple[torch.Tensor, torch.Tensor],
    conv_state: torch.Tensor,
    rec_state: torch.Tensor,
    params: DeltaNetParams,
    value_heads: int,
    value_dim: int,
    eps: float,
    keep: torch.Tensor | None = None,
) -> torch.Tensor:
    """y [T, in_proj rows] (rows may be strided), spans = (starts int64 [R + 1], slots int64 [R]): row r's
    tokens starts[r] .. starts[r + 1] continue the state in slots[r] -> RMSNorm(o) * silu(z)
    [T, value_heads * value_dim] in y's dtype; the slots' conv windows [slots, C, K - 1] and float32
    states [slots, H, dk, dv] are updated in place. `keep` (int64 [T], or None): per token, the row that
    also receives the state and window after it (-1: none), for a verify row's positions."""
    fn = _function(ops, keep is not None)
    assert fn is not None, "checked by available()"
    if y.stride(1) != 1:
        y = y.contiguous()
    starts, slots = spans
    tokens = y.shape[0]
    channels, width = conv_state.shape[1], conv_state.shape[2]
    bf16 = int(y.dtype == torch.bfloat16)
    out = torch.empty(tokens, value_heads * value_dim, dtype=y.dtype)
    rc = fn(
        ops.isa, y.data_ptr(), y.stride(0), bf16, slots.numel(), starts.data_ptr(), slots.data_ptr(),
        conv_state.data_ptr(), int(conv_state.dtype == torch.bfloat16), conv_state.shape[0], channels, width,
        params.conv.data_ptr(), rec_state.data_ptr(), params.k_heads, value_heads, params.key_dim, value_dim,
        params.neg_a.data_ptr(), params.dt_bias.data_ptr(), params.norm.data_ptr(), eps, out.data_ptr(),
        *(() if keep is None else (keep.data_ptr(),)), torch.get_num_threads(),
    )  # fmt: skip
    if rc:
        library.check(rc, f"The CPU Gated DeltaNet step rejected y {tuple(y.shape)} (internal error).")
    return out
