"""Gemma 2 / 3 under tensor parallelism: the Llama slice (shard.py, shard_weights.py: heads, GeGLU
columns, vocab rows) under Gemma's own forward. The layer's o and down projections are row-parallel,
so their partial products are summed (one all-reduce each) before Gemma's post-attention and
post-MLP norms, which need the whole vector; the embedding's sqrt(hidden) scale follows the
vocab-parallel lookup, the final soft-cap the gathered logits. Sliding and global layers, the
attention soft-cap and Gemma 3's q/k norms and second RoPE base act per head, so each rank applies
them to its own heads unchanged."""

from __future__ import annotations

import math

import torch

from localchat.backends.torch.models.gemma import GemmaLayer

from .shard_llama import AllReduced, ParallelLlama


class ParallelGemmaLayer(AllReduced, GemmaLayer):
    """GemmaLayer over this rank's heads and MLP columns, the two row-parallel sums before the norms."""


class ParallelGemma(ParallelLlama):
    """Vocab-parallel embedding (then Gemma's sqrt(hidden) scale) and LM head (then its soft-cap)."""

    final_softcap: float | None

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = super().embed_tokens(input_ids)
        return x * torch.tensor(math.sqrt(self.config.hidden_size), dtype=x.dtype)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = super().logits(hidden)
        cap = self.final_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap
