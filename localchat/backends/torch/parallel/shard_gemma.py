"""Gemma 2 / 3 under tensor parallelism: the Llama slice (shard.py, shard_weights.py: heads, GeGLU
columns, vocab rows) under Gemma's own forward. The layer's o and down projections are row-parallel,
so their partial products are summed (one all-reduce each) before Gemma's post-attention and
post-MLP norms, which need the whole vector; Gemma's model wraps the vocab-parallel lookup (then its
sqrt(hidden) scale) and the gathered logits (then its soft-cap) through super() (shard.py mixes the
vocab-parallel ends in after it). Sliding and global layers, the attention soft-cap and Gemma 3's q/k
norms and second RoPE base act per head, so each rank applies them to its own heads unchanged."""

from __future__ import annotations

from localchat.backends.torch.models.gemma import GemmaLayer

from .shard_llama import AllReduced


class ParallelGemmaLayer(AllReduced, GemmaLayer):
    """GemmaLayer over this rank's heads and MLP columns, the two row-parallel sums before the norms."""
