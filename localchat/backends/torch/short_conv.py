"""Depthwise causal convolution over packed ragged rows, with each sequence's last K - 1 inputs kept in its
state slot (the conv window). LFM2's short-conv layers are this conv between two gates; Mamba-2 runs it
(then silu) over its x|B|C channels. No activation here: callers apply their own.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from localchat.backends.torch.recurrent_kernels import use_triton_recurrent
from localchat.backends.torch.state_cache import StepRows


def conv_row(
    x: torch.Tensor, window: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """One row: x [L, C], window [C, K - 1] (the inputs before it), weight [C, K] -> (conv [L, C], the
    window after the row)."""
    full = torch.cat((window.to(x.dtype), x.t()), dim=1)  # [C, K - 1 + L]
    b = None if bias is None else bias.to(x.dtype)
    out = F.conv1d(full[None], weight[:, None, :].to(x.dtype), b, groups=weight.shape[0])[0]
    return out.t(), full[:, full.shape[1] - window.shape[1] :]


def conv_step(
    x: torch.Tensor, windows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """B rows of one token: x [B, C], windows [B, C, K - 1] -> (conv [B, C], the new windows)."""
    full = torch.cat((windows.to(x.dtype), x[:, :, None]), dim=2)  # [B, C, K]
    out = (full * weight[None].to(x.dtype)).sum(-1)
    if bias is not None:
        out = out + bias.to(x.dtype)
    return out, full[:, :, 1:]


def causal_conv(
    x: torch.Tensor, rows: StepRows, windows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """x [T, C] of a packed step -> conv [T, C]; reads and updates `windows` [slots, C, K - 1] for the
    slot of every row (decode rows batched, longer rows one by one)."""
    out = torch.empty_like(x)
    if rows.decode_tokens is not None:
        idx, slots = rows.decode_tokens, rows.decode_slots
        assert slots is not None
        if use_triton_recurrent(x.device):
            # imports Triton: CUDA (or its interpreter)
            from localchat.backends.torch.cuda import triton_recurrent

            out[idx] = triton_recurrent.conv_step(x[idx], windows, slots, weight, bias, silu=False)
        else:
            y, new = conv_step(x[idx], windows.index_select(0, slots), weight, bias)
            windows.index_copy_(0, slots, new.to(windows.dtype))
            out[idx] = y
    for start, end, slot in rows.prefills:
        y, new = conv_row(x[start:end], windows[slot], weight, bias)
        windows[slot] = new.to(windows.dtype)
        out[start:end] = y
    for t, slot, keep in rows.verify_tokens():  # decode form per position; its window kept in a spec row
        y, new = conv_step(x[t : t + 1], windows[slot : slot + 1], weight, bias)
        windows[slot] = new[0].to(windows.dtype)
        out[t] = y[0]
        if keep >= 0:
            windows[keep] = windows[slot]
    return out
