"""Mixtral (8x7B, 8x22B): Llama's attention with a sparse mixture of SwiGLU experts as the MLP.

Its router takes the softmax over the top-k logits, which equals renormalising the top-k probabilities.
"""

from __future__ import annotations

import torch

from localchat.arch.moe import MoeSpec
from localchat.backends.torch.models.base import DecoderLM
from localchat.backends.torch.models.llama import LlamaLayer
from localchat.backends.torch.models.moe import sparse_moe
from localchat.weights.config import ModelConfig


class MixtralLayer(LlamaLayer):
    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__(config, index)
        self.moe = sparse_moe(MoeSpec.from_config(config), index, config.hidden_size)
        if self.moe is not None:
            self.gate_up = self.down = None

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        return super().mlp(x) if self.moe is None else self.moe.forward(x)


class Model(DecoderLM):
    layer_class = MixtralLayer
    capturable = False  # expert dispatch sizes its groups on the host (moe.py)
