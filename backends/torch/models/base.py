"""The decoder-only causal LM every supported architecture shares; model files pick `LayerOptions`."""

from __future__ import annotations

import torch
from torch import nn

from backends.torch.attention import AttentionMetadata
from backends.torch.layers import DecoderLayer, LayerOptions, Rotary, empty_param, rms_norm
from backends.torch.quant import embed_rows, linear
from localchat.weights.config import ModelConfig


class DecoderLM(nn.Module):
    """embed -> N x (attention + SwiGLU) -> RMSNorm -> LM head (tied to the embedding when configured)."""

    def __init__(self, config: ModelConfig, device: torch.device) -> None:
        super().__init__()
        self.config = config
        options = self.layer_options(config)
        self.embed = empty_param(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, options) for _ in range(config.num_hidden_layers))
        self.norm = empty_param(config.hidden_size)
        self.lm_head = (
            None if config.tie_word_embeddings else empty_param(config.vocab_size, config.hidden_size)
        )
        self.rotary = Rotary(config, device)

    @staticmethod
    def layer_options(config: ModelConfig) -> LayerOptions:
        return LayerOptions()

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[torch.Tensor],
        logits_indices: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """input_ids/positions [T] -> logits [N, vocab] for the tokens at `logits_indices` (all if None)."""
        hidden = self.hidden_states(input_ids, positions, meta, kv_caches)
        return self.logits(hidden if logits_indices is None else hidden[logits_indices])

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[torch.Tensor],
    ) -> torch.Tensor:
        x = embed_rows(input_ids, self.embed, self.norm.dtype)  # [T, hidden]
        cos, sin = self.rotary(positions, x.dtype)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x = layer.forward(x, cos, sin, meta, kv_cache)  # .forward: skip hook dispatch
        return x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden] (pre-norm) -> logits [N, vocab] in the compute dtype."""
        x = rms_norm(hidden, self.norm, self.config.rms_norm_eps)
        return linear(x, self.embed if self.lm_head is None else self.lm_head)
