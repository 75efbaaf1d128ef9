"""The hybrid layers' one-token (decode) updates as Triton kernels, for CUDA.

The torch forms (gated_deltanet.delta_rule_step, mamba2.ssd_step, short_conv.conv_step) gather each
decode row's state slot, update it in a handful of small ops and scatter it back: a dozen launches per
layer. Each kernel here reads a row's slot in place by its index, updates it in registers and writes it
back, one launch per layer and form. The chunked prefill forms stay in torch ops (they are matmuls).

Layouts are the state cache's (state_cache.py): conv windows [slots, C, K - 1], recurrent states
[slots, H, dk, dv] float32, both contiguous. Everything is computed in float32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _conv_step_kernel(
    x_ptr,
    x_stride,
    win_ptr,
    slots_ptr,
    w_ptr,
    bias_ptr,
    out_ptr,
    C,
    K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SILU: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    taps = tl.arange(0, BLOCK_K)
    ok = cols < C
    slot = tl.load(slots_ptr + row).to(tl.int64)
    win = win_ptr + slot * C * (K - 1) + cols[:, None] * (K - 1)
    x = tl.load(x_ptr + row * x_stride + cols, mask=ok, other=0.0)
    is_new = taps[None, :] == K - 1
    # full[:, j]: input t - (K - 1) + j (the window, then this token); the new window is full[:, 1:].
    # Both reads happen before the one write.
    full = tl.load(win + taps[None, :], mask=ok[:, None] & (taps[None, :] < K - 1), other=0.0)
    full = tl.where(is_new, x[:, None].to(tl.float32), full.to(tl.float32))
    shifted = tl.load(win + taps[None, :] + 1, mask=ok[:, None] & (taps[None, :] < K - 2), other=0.0)
    shifted = tl.where(taps[None, :] == K - 2, x[:, None].to(shifted.dtype), shifted)
    weight = tl.load(
        w_ptr + cols[:, None] * K + taps[None, :], mask=ok[:, None] & (taps[None, :] < K), other=0.0
    )
    acc = tl.sum(full * weight.to(tl.float32), 1)
    tl.store(win + taps[None, :], shifted, mask=ok[:, None] & (taps[None, :] < K - 1))
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    if SILU:
        acc = acc * tl.sigmoid(acc)
    tl.store(out_ptr + row * C + cols, acc.to(out_ptr.dtype.element_ty), mask=ok)


def conv_step(
    x: torch.Tensor,
    windows: torch.Tensor,
    slots: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    silu: bool,
) -> torch.Tensor:
    """x [B, C] one token per row -> conv (then silu if asked) [B, C] in x's dtype; updates
    `windows` [slots, C, K - 1] in place at `slots` [B] only."""
    rows, channels = x.shape
    kernel = weight.shape[1]
    assert windows.is_contiguous() and weight.is_contiguous() and x.stride(1) == 1 and kernel >= 2
    out = torch.empty(rows, channels, dtype=x.dtype, device=x.device)
    block = min(triton.next_power_of_2(channels), 256)
    grid = (rows, triton.cdiv(channels, block))
    _conv_step_kernel[grid](
        x, x.stride(0), windows, slots, weight, weight if bias is None else bias, out, channels,
        K=kernel, HAS_BIAS=bias is not None, SILU=silu, BLOCK_C=block, BLOCK_K=triton.next_power_of_2(kernel),
    )  # fmt: skip
    return out


@triton.jit
def _delta_rule_step_kernel(
    mixed_ptr,
    mixed_stride,
    g_ptr,
    beta_ptr,
    state_ptr,
    slots_ptr,
    out_ptr,
    NK,
    NV,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_DK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    row = tl.program_id(0)
    head = tl.program_id(1)
    k_head = head // (NV // NK)  # each key head serves NV / NK value heads
    ks = tl.arange(0, BLOCK_DK)
    vs = tl.program_id(2) * BLOCK_DV + tl.arange(0, BLOCK_DV)
    k_ok = ks < DK
    v_ok = vs < DV
    base = mixed_ptr + row * mixed_stride
    q = tl.load(base + k_head * DK + ks, mask=k_ok, other=0.0).to(tl.float32)
    k = tl.load(base + NK * DK + k_head * DK + ks, mask=k_ok, other=0.0).to(tl.float32)
    v = tl.load(base + 2 * NK * DK + head * DV + vs, mask=v_ok, other=0.0).to(tl.float32)
    # L2 norms as gated_deltanet.l2_normalize (eps inside the root), q scaled by dk ** -0.5
    q = q * tl.rsqrt(tl.sum(q * q, 0) + 1e-6) * (1.0 / tl.sqrt(DK * 1.0))
    k = k * tl.rsqrt(tl.sum(k * k, 0) + 1e-6)
    decay = tl.exp(tl.load(g_ptr + row * NV + head).to(tl.float32))
    beta = tl.load(beta_ptr + row * NV + head).to(tl.float32)
    slot = tl.load(slots_ptr + row).to(tl.int64)
    at = state_ptr + (slot * NV + head) * DK * DV + ks[:, None] * DV + vs[None, :]
    ok = k_ok[:, None] & v_ok[None, :]
    s = tl.load(at, mask=ok, other=0.0) * decay  # [BLOCK_DK, BLOCK_DV]
    delta = (v - tl.sum(k[:, None] * s, 0)) * beta
    s = s + k[:, None] * delta[None, :]
    tl.store(at, s, mask=ok)
    o = tl.sum(q[:, None] * s, 0)
    tl.store(out_ptr + (row * NV + head) * DV + vs, o, mask=v_ok)


def delta_rule_step(
    mixed: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    states: torch.Tensor,
    slots: torch.Tensor,
    k_heads: int,
) -> torch.Tensor:
    """mixed [B, q|k|v channels] after the conv (q, k not yet normalised), g, beta [B, NV] -> o [B, NV, dv]
    float32; updates `states` [slots, NV, dk, dv] float32 in place at `slots` [B] only."""
    rows = mixed.shape[0]
    _, v_heads, dk, dv = states.shape
    assert states.is_contiguous() and states.dtype == torch.float32 and mixed.stride(1) == 1
    g, beta = g.float().contiguous(), beta.float().contiguous()
    out = torch.empty(rows, v_heads, dv, dtype=torch.float32, device=mixed.device)
    block_dk = triton.next_power_of_2(dk)
    block_dv = min(triton.next_power_of_2(dv), max(16, 8192 // block_dk))  # keep the S tile in registers
    grid = (rows, v_heads, triton.cdiv(dv, block_dv))
    _delta_rule_step_kernel[grid](
        mixed, mixed.stride(0), g, beta, states, slots, out, k_heads, v_heads,
        DK=dk, DV=dv, BLOCK_DK=block_dk, BLOCK_DV=block_dv,
    )  # fmt: skip
    return out


@triton.jit
def _ssd_step_kernel(
    xbc_ptr,
    xbc_stride,
    dt_ptr,
    dt_stride,
    dt_bias_ptr,
    a_log_ptr,
    d_ptr,
    state_ptr,
    slots_ptr,
    out_ptr,
    H,
    G,
    P: tl.constexpr,
    N: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    row = tl.program_id(0)
    head = tl.program_id(1)
    group = head // (H // G)
    ps = tl.program_id(2) * BLOCK_P + tl.arange(0, BLOCK_P)
    ns = tl.arange(0, BLOCK_N)
    p_ok = ps < P
    n_ok = ns < N
    base = xbc_ptr + row * xbc_stride
    x = tl.load(base + head * P + ps, mask=p_ok, other=0.0).to(tl.float32)
    b = tl.load(base + H * P + group * N + ns, mask=n_ok, other=0.0).to(tl.float32)
    c = tl.load(base + H * P + G * N + group * N + ns, mask=n_ok, other=0.0).to(tl.float32)
    raw = tl.load(dt_ptr + row * dt_stride + head).to(tl.float32) + tl.load(dt_bias_ptr + head).to(tl.float32)
    dt = tl.where(raw > 20.0, raw, tl.log(1.0 + tl.exp(tl.minimum(raw, 20.0))))  # F.softplus (threshold 20)
    decay = tl.exp(-tl.exp(tl.load(a_log_ptr + head).to(tl.float32)) * dt)
    slot = tl.load(slots_ptr + row).to(tl.int64)
    at = state_ptr + (slot * H + head) * P * N + ps[:, None] * N + ns[None, :]
    ok = p_ok[:, None] & n_ok[None, :]
    s = tl.load(at, mask=ok, other=0.0) * decay + (dt * x)[:, None] * b[None, :]
    tl.store(at, s, mask=ok)
    y = tl.sum(s * c[None, :], 1) + tl.load(d_ptr + head).to(tl.float32) * x
    tl.store(out_ptr + (row * H + head) * P + ps, y, mask=p_ok)


def ssd_step(
    xbc: torch.Tensor,
    dt_raw: torch.Tensor,
    dt_bias: torch.Tensor,
    a_log: torch.Tensor,
    d: torch.Tensor,
    states: torch.Tensor,
    slots: torch.Tensor,
    groups: int,
) -> torch.Tensor:
    """xbc [B, x|B|C] after the conv and silu, dt_raw [B, H] before softplus and bias -> y [B, H, P]
    float32 with the D skip; updates `states` [slots, H, P, N] float32 in place at `slots` [B] only."""
    rows = xbc.shape[0]
    _, heads, head_dim, d_state = states.shape
    assert states.is_contiguous() and states.dtype == torch.float32
    assert xbc.stride(1) == 1 and dt_raw.stride(1) == 1
    out = torch.empty(rows, heads, head_dim, dtype=torch.float32, device=xbc.device)
    block_n = triton.next_power_of_2(d_state)
    block_p = min(triton.next_power_of_2(head_dim), max(16, 8192 // block_n))
    grid = (rows, heads, triton.cdiv(head_dim, block_p))
    _ssd_step_kernel[grid](
        xbc, xbc.stride(0), dt_raw, dt_raw.stride(0), dt_bias, a_log, d, states, slots, out, heads, groups,
        P=head_dim, N=d_state, BLOCK_P=block_p, BLOCK_N=block_n,
    )  # fmt: skip
    return out
