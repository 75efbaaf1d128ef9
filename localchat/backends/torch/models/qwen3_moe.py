"""Qwen3-MoE (30B-A3B, 235B-A22B): Qwen3's attention (q/k norm) with a sparse mixture of SwiGLU experts;
layers in `mlp_only_layers` or off the `decoder_sparse_step` keep a dense MLP."""

from __future__ import annotations

import torch

from localchat.arch.moe import MoeSpec
from localchat.backends.torch.models.base import DecoderLM
from localchat.backends.torch.models.moe import sparse_moe
from localchat.backends.torch.models.qwen3 import Qwen3Layer
from localchat.weights.config import ModelConfig


class Qwen3MoeLayer(Qwen3Layer):
    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__(config, index)
        self.moe = sparse_moe(MoeSpec.from_config(config), index, config.hidden_size)
        if self.moe is not None:
            self.gate_up = self.down = None

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        return super().mlp(x) if self.moe is None else self.moe.forward(x)


class Model(DecoderLM):
    layer_class = Qwen3MoeLayer
    capturable = False  # expert dispatch sizes its groups on the host (moe.py)
