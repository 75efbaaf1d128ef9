"""Depthwise causal convolution over packed ragged rows with MLX, each sequence's last K - 1 inputs kept
in its state slot (the conv window), as localchat/backends/torch/short_conv.py. No activation here:
callers apply their own (LFM2 none, Mamba-2 silu).
"""

from __future__ import annotations

import mlx.core as mx

from localchat.backends.mlx.state_cache import StepRows


def conv_row(
    x: mx.array, window: mx.array, weight: mx.array, bias: mx.array | None
) -> tuple[mx.array, mx.array]:
    """One row: x [L, C], window [C, K - 1] (the inputs before it), weight [C, K] -> (conv [L, C], the
    window after the row)."""
    length, width = x.shape[0], weight.shape[1]
    full = mx.concatenate([window.astype(x.dtype), x.T], axis=1)  # [C, K - 1 + L]
    w = weight.astype(x.dtype)
    # K is small (3-4): K shifted multiply-adds instead of a general conv.
    out = sum((full[:, j : j + length] * w[:, j : j + 1] for j in range(width)), mx.zeros_like(x.T)).T
    if bias is not None:
        out = out + bias.astype(x.dtype)
    return out, full[:, full.shape[1] - (width - 1) :]


def conv_step(
    x: mx.array, windows: mx.array, weight: mx.array, bias: mx.array | None
) -> tuple[mx.array, mx.array]:
    """B rows of one token: x [B, C], windows [B, C, K - 1] -> (conv [B, C], the new windows)."""
    full = mx.concatenate([windows.astype(x.dtype), x[:, :, None]], axis=2)  # [B, C, K]
    out = (full * weight[None].astype(x.dtype)).sum(-1)
    if bias is not None:
        out = out + bias.astype(x.dtype)
    return out, full[:, :, 1:]


def causal_conv(
    x: mx.array, rows: StepRows, windows: mx.array, weight: mx.array, bias: mx.array | None
) -> mx.array:
    """x [T, C] of a packed step -> conv [T, C]; reads and updates `windows` [slots, C, K - 1] in place
    for the slot of every row (decode rows batched, longer rows one by one)."""
    order: list[mx.array] = []
    outs: list[mx.array] = []
    if rows.decode_tokens is not None:
        idx, slots = rows.decode_tokens, rows.decode_slots
        assert slots is not None
        y, new = conv_step(x[idx], windows[slots], weight, bias)
        windows[slots] = new.astype(windows.dtype)
        order.append(idx)
        outs.append(y)
    for start, end, slot in rows.prefills:
        y, new = conv_row(x[start:end], windows[slot], weight, bias)
        windows[slot] = new.astype(windows.dtype)
        order.append(mx.arange(start, end, dtype=mx.int32))
        outs.append(y)
    for t, slot, keep in rows.verify_tokens():  # decode form per position; its window kept in a spec row
        y, new = conv_step(x[t : t + 1], windows[slot : slot + 1], weight, bias)
        windows[slot] = new[0].astype(windows.dtype)
        if keep >= 0:
            windows[keep] = windows[slot]
        order.append(mx.array([t], dtype=mx.int32))
        outs.append(y)
    out = mx.zeros_like(x)
    out[mx.concatenate(order)] = mx.concatenate(outs)
    return out
