"""Mamba-2 with MLX arrays, on packed ragged batches: the maths and layout of
localchat/backends/torch/mamba2.py (read its docstring). Prefill rows take the chunked (SSD) form, decode
rows the one-step recurrence batched over rows; the state S [heads, head_dim, d_state] is float32 in the
sequence's state slot, the conv window beside it (short_conv.py).
"""

from __future__ import annotations

import mlx.core as mx

from localchat.backends.mlx.models.base import Layer
from localchat.backends.mlx.quant import Weight, linear
from localchat.backends.mlx.short_conv import causal_conv
from localchat.backends.mlx.state_cache import LayerStateShape, StepRows

CHUNK = 64


def _softplus(x: mx.array) -> mx.array:
    return mx.logaddexp(x, mx.zeros_like(x))


def ssd_chunked(
    x: mx.array, dt: mx.array, a: mx.array, b: mx.array, c: mx.array, state: mx.array, chunk: int = CHUNK
) -> tuple[mx.array, mx.array]:
    """One row. x [L, H, P], dt [L, H] (after softplus), a [L, H] (dt * A, <= 0), b, c [L, H, N] (per head),
    state [H, P, N] float32 -> (y [L, H, P] float32 without the D term, new state)."""
    length = x.shape[0]
    pad = (-length) % chunk
    # Padding tokens have dt = 0: they neither write nor decay the state.
    x, b, c = (mx.pad(t.astype(mx.float32), [(0, pad), (0, 0), (0, 0)]) for t in (x, b, c))
    dt, a = (mx.pad(t.astype(mx.float32), [(0, pad), (0, 0)]) for t in (dt, a))
    heads = x.shape[1]
    n = x.shape[0] // chunk

    def split(t: mx.array) -> mx.array:  # [L, H, d] -> [H, N, C, d]
        return t.reshape(n, chunk, heads, -1).transpose(2, 0, 1, 3)

    x, b, c = split(x), split(b), split(c)
    dt, a = split(dt[..., None])[..., 0], split(a[..., None])[..., 0]  # [H, N, C]
    cum = mx.cumsum(a, axis=-1)
    causal = mx.tril(mx.ones((chunk, chunk), dtype=mx.bool_))
    decay = mx.exp(mx.where(causal, cum[..., :, None] - cum[..., None, :], -mx.inf))
    xdt = x * dt[..., None]
    intra = ((c @ b.swapaxes(-1, -2)) * decay) @ xdt  # [H, N, C, P]
    from_start = mx.exp(cum)[..., None]
    to_end = mx.exp(cum[..., -1:] - cum)[..., None]
    chunk_decay = mx.exp(cum[..., -1])[..., None, None]  # [H, N, 1, 1]
    s = state.astype(mx.float32)
    outs = []
    for i in range(n):
        outs.append(intra[:, i] + (c[:, i] @ s.swapaxes(-1, -2)) * from_start[:, i])
        s = s * chunk_decay[:, i] + (xdt[:, i] * to_end[:, i]).swapaxes(-1, -2) @ b[:, i]
    out = mx.stack(outs, axis=1)
    return out.transpose(1, 2, 0, 3).reshape(n * chunk, heads, -1)[:length], s


def ssd_step(
    x: mx.array, dt: mx.array, a: mx.array, b: mx.array, c: mx.array, state: mx.array
) -> tuple[mx.array, mx.array]:
    """B rows of one token: x [B, H, P], dt, a [B, H], b, c [B, H, N], state [B, H, P, N] float32 ->
    (y [B, H, P] float32 without the D term, new state)."""
    xdt = x.astype(mx.float32) * dt[..., None]
    s = state * mx.exp(a)[..., None, None] + xdt[..., :, None] * b[..., None, :]
    return (s @ c[..., :, None])[..., 0], s


class Mamba2Mixer(Layer):  # a Layer for its declared-weights bookkeeping; called through `forward`
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
        self.shapes = {}
        # The chunked scan clamps dt from below (Nemotron-H: time_step_min); the one-step update does not.
        self.dt_min = dt_min
        self.heads, self.head_dim, self.groups, self.d_state, self.eps = heads, head_dim, groups, d_state, eps
        self.kernel = conv_kernel
        self.inner = heads * head_dim
        self.conv_channels = self.inner + 2 * groups * d_state
        self.in_proj: Weight | None = None
        self.in_proj_bias: mx.array | None = None
        self.conv: mx.array | None = None
        self.conv_bias: mx.array | None = None
        self.dt_bias: mx.array | None = None
        self.A_log: mx.array | None = None
        self.D: mx.array | None = None
        self.gated_norm: mx.array | None = None
        self.out: Weight | None = None
        self.out_bias: mx.array | None = None
        width = self.inner + self.conv_channels + heads
        self.declare("in_proj", width, hidden)
        self.declare("conv", self.conv_channels, 1, conv_kernel)
        for name in ("dt_bias", "A_log", "D"):
            self.declare(name, heads)
        self.declare("gated_norm", self.inner)
        self.declare("out", hidden, self.inner)
        if proj_bias:
            self.declare("in_proj_bias", width)
            self.declare("out_bias", hidden)
        if conv_bias:
            self.declare("conv_bias", self.conv_channels)

    def state_shape(self) -> LayerStateShape:
        # The recurrent state [heads, head_dim, d_state]: LayerStateShape's (heads, key_dim, value_dim).
        return LayerStateShape(self.conv_channels, self.kernel - 1, self.heads, self.head_dim, self.d_state)

    def forward(self, x: mx.array, rows: StepRows, windows: mx.array, states: mx.array) -> mx.array:
        """x [T, hidden] normed -> [T, hidden], updating this layer's conv windows and states in place."""
        assert self.in_proj is not None and self.conv is not None and self.out is not None
        assert self.dt_bias is not None and self.A_log is not None and self.D is not None
        tokens = x.shape[0]
        h, p, g, n, inner = self.heads, self.head_dim, self.groups, self.d_state, self.inner
        y = linear(x, self.in_proj, self.in_proj_bias)
        z, xbc, dt_raw = (
            y[:, :inner],
            y[:, inner : inner + self.conv_channels],
            y[:, inner + self.conv_channels :],
        )
        xbc = causal_conv(xbc, rows, windows, self.conv[:, 0, :], self.conv_bias)
        xbc = xbc * mx.sigmoid(xbc)
        xs = xbc[:, :inner].astype(mx.float32).reshape(tokens, h, p)
        b = mx.repeat(xbc[:, inner : inner + g * n].astype(mx.float32).reshape(tokens, g, n), h // g, axis=1)
        c = mx.repeat(xbc[:, inner + g * n :].astype(mx.float32).reshape(tokens, g, n), h // g, axis=1)
        dt = _softplus(dt_raw.astype(mx.float32) + self.dt_bias.astype(mx.float32))
        decay_rate = -mx.exp(self.A_log.astype(mx.float32))
        order: list[mx.array] = []
        outs: list[mx.array] = []
        if rows.decode_tokens is not None:
            idx, slots = rows.decode_tokens, rows.decode_slots
            assert slots is not None
            o, new = ssd_step(xs[idx], dt[idx], dt[idx] * decay_rate, b[idx], c[idx], states[slots])
            states[slots] = new
            order.append(idx)
            outs.append(o)
        for start, end, slot in rows.prefills:
            dt_row = mx.maximum(dt[start:end], self.dt_min) if self.dt_min > 0 else dt[start:end]
            o, new = ssd_chunked(
                xs[start:end], dt_row, dt_row * decay_rate, b[start:end], c[start:end], states[slot]
            )
            states[slot] = new
            order.append(mx.arange(start, end, dtype=mx.int32))
            outs.append(o)
        for t, slot, keep in rows.verify_tokens():  # decode form per position (as plain decoding runs it)
            s = slice(t, t + 1)
            o, new = ssd_step(xs[s], dt[s], dt[s] * decay_rate, b[s], c[s], states[slot : slot + 1])
            states[slot] = new[0]
            if keep >= 0:  # the state after this position, for the engine to restore (hybrid_spec.py)
                states[keep] = states[slot]
            order.append(mx.array([t], dtype=mx.int32))
            outs.append(o)
        core = mx.zeros((tokens, h, p), dtype=mx.float32)
        core[mx.concatenate(order)] = mx.concatenate(outs)
        core = core + xs * self.D.astype(mx.float32)[:, None]
        # RMSNorm per group of y * silu(z) (the gate before the norm), then the norm's scale.
        zf = z.astype(mx.float32)
        gated = (core.reshape(tokens, inner) * zf * mx.sigmoid(zf)).reshape(tokens, g, inner // g)
        normed = gated * mx.rsqrt((gated * gated).mean(-1, keepdims=True) + self.eps)
        assert self.gated_norm is not None
        scaled = normed.reshape(tokens, inner) * self.gated_norm.astype(mx.float32)
        return linear(scaled.astype(x.dtype), self.out, self.out_bias)
