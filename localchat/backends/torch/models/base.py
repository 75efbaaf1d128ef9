"""The decoder-only causal LM skeleton: embed -> N layers -> final norm -> LM head.

A model file subclasses `DecoderLM`, names its `layer_class`, and overrides a step where its
architecture differs (embedding scale, logit soft-capping, ...).
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from localchat.backends.torch.attention import AttentionMetadata
from localchat.backends.torch.cpu import decode_step
from localchat.backends.torch.cpu.decode_step import FusedDecode
from localchat.backends.torch.cuda.gpu_attention_meta import TritonAttentionMetadata
from localchat.backends.torch.kv_cache import KVCache
from localchat.backends.torch.layers import Rotary, empty_param, rms_norm
from localchat.backends.torch.quant import embed_rows, linear
from localchat.weights.config import ModelConfig

# The CPU path's metadata, or the Triton kernels' on CUDA: layers pass it through to `paged_attention`.
StepMetadata = AttentionMetadata | TritonAttentionMetadata


class Layer(Protocol):
    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: StepMetadata,
        kv_cache: KVCache,
    ) -> torch.Tensor: ...


class DecoderLM(nn.Module):
    layer_class: type[nn.Module]
    capturable = True  # a decode step may be recorded as a CUDA graph (no host syncs inside)

    def __init__(self, config: ModelConfig, device: torch.device) -> None:
        super().__init__()
        self.config = config
        self.embed = empty_param(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(self.layer_class(config, i) for i in range(config.num_hidden_layers))
        self.norm = empty_param(config.hidden_size)
        self.lm_head = (
            None if config.tie_word_embeddings else empty_param(config.vocab_size, config.hidden_size)
        )
        self.rotary = Rotary(config, device)
        self.fused_decode: FusedDecode | bool | None = False  # False: not planned yet (decode_step.py)

    def after_load(self) -> None:
        """Called once every weight is in place (a family may fold constants into them)."""

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: StepMetadata,
        kv_caches: list[KVCache],
        logits_indices: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """input_ids/positions [T] -> logits [N, vocab] for the tokens at `logits_indices` (all if None)."""
        hidden = self.hidden_states(input_ids, positions, meta, kv_caches)
        return self.logits(hidden if logits_indices is None else hidden[logits_indices])

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        return embed_rows(input_ids, self.embed, self.norm.dtype)  # [T, hidden]

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: StepMetadata,
        kv_caches: list[KVCache],
    ) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary(positions, x.dtype)
        fused = self.decode_plan()
        if fused is not None and fused.takes(x, cos, meta, kv_caches):
            assert isinstance(meta, AttentionMetadata)
            return fused.run(x, cos, sin, meta, kv_caches)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x = layer.forward(x, cos, sin, meta, kv_cache)  # .forward: skip hook dispatch
        return x

    def decode_plan(self) -> FusedDecode | None:
        """The layers as one C call for decode steps (decode_step.py), planned on first use: the weights
        are in place by then. None where the layers or their weights do not fit that step."""
        if self.fused_decode is False:
            self.fused_decode = decode_step.plan(self.layers, self.norm.dtype)
        assert self.fused_decode is not True
        return self.fused_decode

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden] (pre-norm) -> logits [N, vocab] in the compute dtype."""
        x = rms_norm(hidden, self.norm, self.config.rms_norm_eps)
        return linear(x, self.embed if self.lm_head is None else self.lm_head)
