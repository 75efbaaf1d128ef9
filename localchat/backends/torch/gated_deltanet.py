"""Gated DeltaNet (Qwen3-Next, Qwen3.5 linear-attention layers) in plain torch, on packed ragged batches.

Per value head the layer keeps a matrix state S [dk, dv]. For each token, with q and k L2-normalised and
q scaled by dk ** -0.5, decay a = exp(g) and write strength beta:

    S <- a * S;   S <- S + k (beta * (v - k^T S))^T;   o = q^T S

Before it, a depthwise causal conv (width K) runs over the q|k|v channels, so a sequence also carries its
last K - 1 inputs (the conv window). Both live in a state slot (state_cache.py), not in the KV cache.

Prefill rows use the chunked form: within a chunk of C tokens the updates are a lower-triangular system
(solved once per chunk), and only the C-to-C hand-over of S is sequential. Decode rows (one token each)
take the recurrent form, batched over rows. Everything inside runs in float32, as the reference does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK = 64


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def conv_prefill(
    x: torch.Tensor, window: torch.Tensor, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One row: x [L, C] new inputs, window [C, K - 1] the previous inputs, weight [C, K] ->
    (silu(conv) [L, C], the new window [C, K - 1])."""
    full = torch.cat((window.to(x.dtype), x.t()), dim=1)  # [C, K - 1 + L]
    out = F.conv1d(full[None], weight[:, None, :].to(x.dtype), groups=weight.shape[0])[0]  # [C, L]
    return F.silu(out).t(), full[:, -window.shape[1] :]


def conv_decode(
    x: torch.Tensor, windows: torch.Tensor, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """B rows of one token: x [B, C], windows [B, C, K - 1] -> (silu(conv) [B, C], new windows)."""
    full = torch.cat((windows.to(x.dtype), x[:, :, None]), dim=2)  # [B, C, K]
    out = (full * weight[None].to(x.dtype)).sum(-1)
    return F.silu(out), full[:, :, 1:]


def delta_rule_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    chunk: int = CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One row. q, k [L, H, dk] (normalised, q scaled), v [L, H, dv], g, beta [L, H], state [H, dk, dv]
    (float32) -> (o [L, H, dv] float32, the state after the row)."""
    length = q.shape[0]
    pad = (-length) % chunk
    # Padding tokens have k = v = beta = 0 and g = 0: they neither write nor decay the state.
    q, k, v = (F.pad(t.float(), (0, 0, 0, 0, 0, pad)) for t in (q, k, v))
    g, beta = (F.pad(t.float(), (0, 0, 0, pad)) for t in (g, beta))
    heads, dv = k.shape[1], v.shape[2]
    n = q.shape[0] // chunk

    # [H, N, C, d]: heads first, then chunks.
    def split(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(n, chunk, heads, -1).permute(2, 0, 1, 3)

    q, k, v = split(q), split(k), split(v)
    g, beta = split(g).squeeze(-1), split(beta).squeeze(-1)  # [H, N, C]
    cum = g.cumsum(-1)  # log of the decay from the chunk start through token i
    # decay[i, j] = exp(cum_i - cum_j) for j <= i, 0 above the diagonal.
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(~causal, float("-inf")).exp()
    kb = k * beta[..., None]
    # The in-chunk writes depend on each other through S: (I + A) U = beta * V with A strictly lower.
    system = (kb @ k.transpose(-1, -2)) * decay
    system = system.tril(-1) + torch.eye(chunk, device=q.device)
    solved = torch.linalg.solve_triangular(
        system, torch.cat((v * beta[..., None], kb * cum.exp()[..., None]), -1), upper=False
    )
    values, decayed_keys = solved[..., :dv], solved[..., dv:]  # U [H,N,C,dv], W [H,N,C,dk]
    scores = (q @ k.transpose(-1, -2)) * decay  # inclusive of the diagonal
    q_decayed = q * cum.exp()[..., None]
    k_to_end = k * (cum[..., -1:] - cum).exp()[..., None]
    chunk_decay = cum[..., -1].exp()[..., None, None]  # [H, N, 1, 1]
    out = torch.empty(heads, n, chunk, dv, dtype=torch.float32, device=q.device)
    s = state.float()
    for i in range(n):
        fixed = values[:, i] - decayed_keys[:, i] @ s  # what each token writes, given the start state
        out[:, i] = q_decayed[:, i] @ s + scores[:, i] @ fixed
        s = s * chunk_decay[:, i] + k_to_end[:, i].transpose(-1, -2) @ fixed
    out = out.permute(1, 2, 0, 3).reshape(n * chunk, heads, dv)[:length]
    return out, s


def delta_rule_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """B rows of one token: q, k [B, H, dk], v [B, H, dv], g, beta [B, H], state [B, H, dk, dv] float32
    -> (o [B, H, dv] float32, new state). Batched matmuls over the B * H heads: each pass reads the
    state once (the decode step is bound by reading it)."""
    rows, heads, dk, dv = state.shape
    q, k, v = (t.float().reshape(rows * heads, 1, -1) for t in (q, k, v))
    s = (state * g.float().exp().reshape(rows, heads, 1, 1)).view(rows * heads, dk, dv)
    remembered = torch.bmm(k, s)  # k^T S: [BH, 1, dv]
    delta = (v - remembered) * beta.float().reshape(rows * heads, 1, 1)
    s = torch.baddbmm(s, k.transpose(1, 2), delta)  # S + k delta^T
    out = torch.bmm(q, s)
    return out.view(rows, heads, dv), s.view(rows, heads, dk, dv)
