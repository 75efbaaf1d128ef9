"""Prefill SDPA with query and key lengths padded to a few shapes, so a long-running CPU server stays flat.

Why: torch's CPU flash-attention kernel keeps state per distinct (query length, key length) shape it
has seen. A chat server sees a new prompt length on almost every request, and the 20-minute soak
(benchmarks/soak.py) measured resident memory growing ~0.05 MiB per request for that reason alone;
isolated, 290 distinct lengths grew RSS by ~100 MiB unpadded and ~4 MiB padded to multiples of 64.
Padding: zero keys/values after the real ones, masked out; padded query rows see one real key (a
row with no allowed key would be NaN) and are dropped. Real rows compute the same softmax over the
same keys. Only on CPU: CUDA kernels do not keep such state, and the padding would be wasted work.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

PAD_MULTIPLE = 64


def _padded(n: int) -> int:
    return -(-n // PAD_MULTIPLE) * PAD_MULTIPLE


def prefill_sdpa(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float | None = None,
) -> torch.Tensor:
    """queries [heads, L, d], keys/values [heads, S, d], mask bool [L, S] (True = attend) or None for
    causal attention with L == S -> [heads, L, d]."""
    q_len, k_len = queries.shape[1], keys.shape[1]
    if queries.device.type != "cpu":
        out = F.scaled_dot_product_attention(
            queries[None], keys[None], values[None], attn_mask=mask, is_causal=mask is None, scale=scale
        )
        return out[0]
    q_pad, k_pad = _padded(q_len) - q_len, _padded(k_len) - k_len
    padded_mask = None
    if mask is None:
        # Causal with L == S: padded keys sit after every real query, so the causal mask hides them.
        assert q_len == k_len, "causal prefill needs the queries to be the whole context"
    else:
        padded_mask = F.pad(mask, (0, k_pad, 0, q_pad), value=False)
        padded_mask[q_len:, 0] = True
    # 4-D inputs: with 3-D ones SDPA on CPU falls back to its unfused math kernel (2-3x slower).
    out = F.scaled_dot_product_attention(
        F.pad(queries, (0, 0, 0, q_pad))[None],
        F.pad(keys, (0, 0, 0, k_pad))[None],
        F.pad(values, (0, 0, 0, k_pad))[None],
        attn_mask=padded_mask,
        is_causal=mask is None,
        scale=scale,
    )
    return out[0, :, :q_len]
