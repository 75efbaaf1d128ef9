"""Mamba-2 (Granite 4.0-H, Nemotron-H) in plain torch, on packed ragged batches.

in_proj gives z (the gate), x|B|C (the conv channels) and dt (one per head). A depthwise causal conv then
silu runs over x|B|C (short_conv.py keeps its window). Per head h (its B/C group g = h // (H / G)), with
dt = softplus(dt + dt_bias) and a = dt * A (A = -exp(A_log)), the state S [head_dim, d_state] evolves as

    S <- exp(a) * S + dt * x B^T;   y = S C + D * x

then y * silu(z) goes through an RMSNorm per group and out_proj. S lives in float32 in the sequence's
state slot. Prefill rows take the chunked (SSD) form: inside a chunk the outputs are one masked matmul,
and only the chunk-to-chunk hand-over of S is sequential; decode rows take the one-step recurrence,
batched over rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from localchat.backends.torch.layers import empty_param
from localchat.backends.torch.quant import linear
from localchat.backends.torch.recurrent_kernels import use_triton_recurrent
from localchat.backends.torch.short_conv import causal_conv
from localchat.backends.torch.state_cache import LayerStateShape, StepRows

CHUNK = 64


def ssd_chunked(
    x: torch.Tensor,
    dt: torch.Tensor,
    a_log_decay: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    state: torch.Tensor,
    chunk: int = CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One row. x [L, H, P], dt [L, H] (after softplus), a_log_decay [L, H] (dt * A, <= 0), b, c [L, H, N]
    (already per head), state [H, P, N] float32 -> (y [L, H, P] float32 without the D term, new state)."""
    length = x.shape[0]
    pad = (-length) % chunk
    # Padding tokens have dt = 0: they neither write nor decay the state.
    x, b, c = (F.pad(t.float(), (0, 0, 0, 0, 0, pad)) for t in (x, b, c))
    dt, a = (F.pad(t.float(), (0, 0, 0, pad)) for t in (dt, a_log_decay))
    heads = x.shape[1]
    n = x.shape[0] // chunk

    def split(t: torch.Tensor) -> torch.Tensor:  # [L, H, d] -> [H, N, C, d]
        return t.reshape(n, chunk, heads, -1).permute(2, 0, 1, 3)

    x, b, c = split(x), split(b), split(c)
    dt, a = split(dt[..., None]).squeeze(-1), split(a[..., None]).squeeze(-1)  # [H, N, C]
    cum = a.cumsum(-1)
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=x.device).tril()
    decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(~causal, float("-inf")).exp()
    xdt = x * dt[..., None]
    intra = ((c @ b.transpose(-1, -2)) * decay) @ xdt  # [H, N, C, P]
    from_start = cum.exp()[..., None]  # decay from the chunk start through token i
    to_end = (cum[..., -1:] - cum).exp()[..., None]  # decay from token j through the chunk end
    chunk_decay = cum[..., -1].exp()[..., None, None]  # [H, N, 1, 1]
    out = torch.empty_like(intra)
    s = state.float()
    for i in range(n):
        out[:, i] = intra[:, i] + (c[:, i] @ s.transpose(-1, -2)) * from_start[:, i]
        s = s * chunk_decay[:, i] + (xdt[:, i] * to_end[:, i]).transpose(-1, -2) @ b[:, i]
    return out.permute(1, 2, 0, 3).reshape(n * chunk, heads, -1)[:length], s


def ssd_step(
    x: torch.Tensor,
    dt: torch.Tensor,
    a_log_decay: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """B rows of one token: x [B, H, P], dt, a_log_decay [B, H], b, c [B, H, N], state [B, H, P, N] float32
    -> (y [B, H, P] float32 without the D term, new state)."""
    xdt = x.float() * dt.float()[..., None]
    s = state * a_log_decay.float().exp()[..., None, None] + xdt[..., :, None] * b.float()[..., None, :]
    return (s @ c.float()[..., :, None])[..., 0], s


class Mamba2Mixer(nn.Module):
    """One Mamba-2 mixer's weights and its forward over a packed step."""

    def __init__(
        self,
        hidden: int,
        heads: int,
        head_dim: int,
        groups: int,
        d_state: int,
        conv_kernel: int,
        eps: float,
        conv_bias: bool,
        proj_bias: bool,
        dt_min: float = 0.0,
    ) -> None:
        super().__init__()
        # The chunked scan clamps dt from below (Nemotron-H: time_step_min); as in transformers and
        # mamba_ssm, the one-step update does not.
        self.dt_min = dt_min
        self.heads, self.head_dim, self.groups, self.d_state, self.eps = heads, head_dim, groups, d_state, eps
        self.inner = heads * head_dim
        self.conv_channels = self.inner + 2 * groups * d_state
        self.in_proj = empty_param(self.inner + self.conv_channels + heads, hidden)
        self.in_proj_bias = empty_param(self.inner + self.conv_channels + heads) if proj_bias else None
        self.conv = empty_param(self.conv_channels, 1, conv_kernel)
        self.conv_bias = empty_param(self.conv_channels) if conv_bias else None
        self.dt_bias = empty_param(heads)
        self.A_log = empty_param(heads)
        self.D = empty_param(heads)
        self.gated_norm = empty_param(self.inner)
        self.out = empty_param(hidden, self.inner)
        self.out_bias = empty_param(hidden) if proj_bias else None

    def state_shape(self) -> LayerStateShape:
        # The recurrent state [heads, head_dim, d_state]: LayerStateShape's (heads, key_dim, value_dim).
        return LayerStateShape(
            self.conv_channels, self.conv.shape[-1] - 1, self.heads, self.head_dim, self.d_state
        )

    def forward(
        self, x: torch.Tensor, rows: StepRows, windows: torch.Tensor, states: torch.Tensor
    ) -> torch.Tensor:
        """x [T, hidden] normed -> [T, hidden], reading and updating this layer's conv windows and states."""
        tokens = x.shape[0]
        h, p, g, n, inner = self.heads, self.head_dim, self.groups, self.d_state, self.inner
        y = linear(x, self.in_proj)
        if self.in_proj_bias is not None:
            y = y + self.in_proj_bias
        z, xbc, dt_raw = (
            y[:, :inner],
            y[:, inner : inner + self.conv_channels],
            y[:, inner + self.conv_channels :],
        )
        xbc = F.silu(causal_conv(xbc.contiguous(), rows, windows, self.conv[:, 0, :], self.conv_bias))
        xs = xbc[:, :inner].float().view(tokens, h, p)
        b = xbc[:, inner : inner + g * n].float().view(tokens, g, n).repeat_interleave(h // g, dim=1)
        c = xbc[:, inner + g * n :].float().view(tokens, g, n).repeat_interleave(h // g, dim=1)
        dt = F.softplus(dt_raw.float() + self.dt_bias.float())
        decay_rate = -self.A_log.float().exp()
        a = dt * decay_rate
        core = torch.empty(tokens, h, p, dtype=torch.float32, device=x.device)
        skip = self.D.float()[:, None]  # the D term, added per row kind (the decode kernel adds its own)
        if rows.decode_tokens is not None:
            idx, slots = rows.decode_tokens, rows.decode_slots
            assert slots is not None
            if use_triton_recurrent(x.device):
                # imports Triton: CUDA (or its interpreter)
                from localchat.backends.torch.cuda import triton_recurrent

                core[idx] = triton_recurrent.ssd_step(  # with the D skip
                    xbc[idx], dt_raw[idx], self.dt_bias, self.A_log, self.D, states, slots, g
                )
            else:
                o, new = ssd_step(xs[idx], dt[idx], a[idx], b[idx], c[idx], states.index_select(0, slots))
                states.index_copy_(0, slots, new)
                core[idx] = o + xs[idx] * skip
        for start, end, slot in rows.prefills:
            dt_row = dt[start:end].clamp(min=self.dt_min) if self.dt_min > 0 else dt[start:end]
            o, new = ssd_chunked(
                xs[start:end], dt_row, dt_row * decay_rate, b[start:end], c[start:end], states[slot]
            )
            states[slot] = new
            core[start:end] = o + xs[start:end] * skip
        for t, slot, keep in rows.verify_tokens():  # decode form per position (as plain decoding runs it)
            o, new = ssd_step(
                xs[t : t + 1],
                dt[t : t + 1],
                a[t : t + 1],
                b[t : t + 1],
                c[t : t + 1],
                states[slot : slot + 1],
            )
            states[slot] = new[0]
            core[t] = o[0] + xs[t] * skip
            if keep >= 0:  # the state after this position, for the engine to restore (hybrid_spec.py)
                states[keep] = states[slot]
        # RMSNorm per group of y * silu(z) (the gate before the norm), then the norm's scale.
        gated = (core.reshape(tokens, inner) * F.silu(z.float())).view(tokens, g, inner // g)
        normed = gated * torch.rsqrt(gated.pow(2).mean(-1, keepdim=True) + self.eps)
        out = linear((normed.view(tokens, inner) * self.gated_norm.float()).to(x.dtype), self.out)
        return out if self.out_bias is None else out + self.out_bias
