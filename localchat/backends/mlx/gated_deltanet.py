"""Gated DeltaNet (Qwen3-Next, Qwen3.5 linear-attention layers) with MLX arrays, on packed ragged batches.

The same maths and layout as localchat/backends/torch/gated_deltanet.py (read its docstring for the
update rule): per value head a float32 matrix state S [dk, dv], a depthwise causal conv of width K over
q|k|v before it. Prefill rows take the chunked form (one lower-triangular solve per chunk), decode rows
the one-step recurrent form batched over rows.

MLX runs `linalg.solve_triangular` on a CPU stream only; on Metal the solve is routed to one (unified
memory: no copy), everything else stays on the current stream. Streams are thread-local since mlx 0.31.2
(runner.py), so the CPU stream is made per thread: the engine thread cannot use the main thread's.
"""

from __future__ import annotations

import threading

import mlx.core as mx

CHUNK = 64
_streams = threading.local()


def _cpu_stream() -> mx.Stream | None:
    """None (the current stream) on the CPU device, else this thread's own CPU stream."""
    if mx.default_device() == mx.cpu:
        return None
    stream = getattr(_streams, "cpu", None)
    if stream is None:
        stream = _streams.cpu = mx.new_stream(mx.Device(mx.cpu))
    return stream


def l2_normalize(x: mx.array, eps: float = 1e-6) -> mx.array:
    return x * mx.rsqrt((x * x).sum(-1, keepdims=True) + eps)


def silu(x: mx.array) -> mx.array:
    return x * mx.sigmoid(x)


def conv_prefill(x: mx.array, window: mx.array, weight: mx.array) -> tuple[mx.array, mx.array]:
    """One row: x [L, C] new inputs, window [C, K - 1] the previous inputs, weight [C, K] ->
    (silu(conv) [L, C], the new window [C, K - 1])."""
    length, width = x.shape[0], weight.shape[1]
    full = mx.concatenate([window.astype(x.dtype), x.T], axis=1)  # [C, K - 1 + L]
    w = weight.astype(x.dtype)
    # K is small (4): K shifted multiply-adds beat a general conv here.
    out = sum((full[:, j : j + length] * w[:, j : j + 1] for j in range(width)), mx.zeros_like(x.T))
    return silu(out).T, full[:, full.shape[1] - (width - 1) :]


def conv_decode(x: mx.array, windows: mx.array, weight: mx.array) -> tuple[mx.array, mx.array]:
    """B rows of one token: x [B, C], windows [B, C, K - 1] -> (silu(conv) [B, C], new windows)."""
    full = mx.concatenate([windows.astype(x.dtype), x[:, :, None]], axis=2)  # [B, C, K]
    out = (full * weight[None].astype(x.dtype)).sum(-1)
    return silu(out), full[:, :, 1:]


def delta_rule_chunked(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    g: mx.array,
    beta: mx.array,
    state: mx.array,
    chunk: int = CHUNK,
) -> tuple[mx.array, mx.array]:
    """One row. q, k [L, H, dk] (normalised, q scaled), v [L, H, dv], g, beta [L, H], state [H, dk, dv]
    (float32) -> (o [L, H, dv] float32, the state after the row)."""
    length = q.shape[0]
    pad = (-length) % chunk
    # Padding tokens have k = v = beta = 0 and g = 0: they neither write nor decay the state.
    q, k, v = (mx.pad(t.astype(mx.float32), [(0, pad), (0, 0), (0, 0)]) for t in (q, k, v))
    g, beta = (mx.pad(t.astype(mx.float32), [(0, pad), (0, 0)]) for t in (g, beta))
    heads, dv = k.shape[1], v.shape[2]
    n = q.shape[0] // chunk

    def split(t: mx.array) -> mx.array:  # [L, H, d] -> [H, N, C, d]
        return t.reshape(n, chunk, heads, -1).transpose(2, 0, 1, 3)

    q, k, v = split(q), split(k), split(v)
    g, beta = split(g[..., None])[..., 0], split(beta[..., None])[..., 0]  # [H, N, C]
    cum = mx.cumsum(g, axis=-1)  # log of the decay from the chunk start through token i
    causal = mx.tril(mx.ones((chunk, chunk), dtype=mx.bool_))
    decay = mx.exp(mx.where(causal, cum[..., :, None] - cum[..., None, :], -mx.inf))
    kb = k * beta[..., None]
    # The in-chunk writes depend on each other through S: (I + A) U = beta * V with A strictly lower.
    system = mx.tril((kb @ k.swapaxes(-1, -2)) * decay, -1) + mx.eye(chunk)
    rhs = mx.concatenate([v * beta[..., None], kb * mx.exp(cum)[..., None]], axis=-1)
    solved = mx.linalg.solve_triangular(system, rhs, upper=False, stream=_cpu_stream())
    values, decayed_keys = solved[..., :dv], solved[..., dv:]  # U [H,N,C,dv], W [H,N,C,dk]
    scores = (q @ k.swapaxes(-1, -2)) * decay  # inclusive of the diagonal
    q_decayed = q * mx.exp(cum)[..., None]
    k_to_end = k * mx.exp(cum[..., -1:] - cum)[..., None]
    chunk_decay = mx.exp(cum[..., -1])[..., None, None]  # [H, N, 1, 1]
    s = state.astype(mx.float32)
    outs = []
    for i in range(n):
        fixed = values[:, i] - decayed_keys[:, i] @ s  # what each token writes, given the start state
        outs.append(q_decayed[:, i] @ s + scores[:, i] @ fixed)
        s = s * chunk_decay[:, i] + k_to_end[:, i].swapaxes(-1, -2) @ fixed
    out = mx.stack(outs, axis=1)  # [H, N, C, dv]
    return out.transpose(1, 2, 0, 3).reshape(n * chunk, heads, dv)[:length], s


def delta_rule_step(
    q: mx.array, k: mx.array, v: mx.array, g: mx.array, beta: mx.array, state: mx.array
) -> tuple[mx.array, mx.array]:
    """B rows of one token: q, k [B, H, dk], v [B, H, dv], g, beta [B, H], state [B, H, dk, dv] float32
    -> (o [B, H, dv] float32, new state)."""
    q, k, v = (t.astype(mx.float32) for t in (q, k, v))
    s = state * mx.exp(g.astype(mx.float32))[..., None, None]
    remembered = k[..., None, :] @ s  # k^T S: [B, H, 1, dv]
    delta = (v[..., None, :] - remembered) * beta.astype(mx.float32)[..., None, None]
    s = s + k[..., :, None] @ delta  # S + k delta^T
    return (q[..., None, :] @ s)[..., 0, :], s
