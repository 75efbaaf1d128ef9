"""GLM-4.5 / 4.6 / 4.7 (and Air): Llama's attention with q/k/v biases and no o bias, RoPE on part of each
head (`partial_rotary_factor`, 0.5), optionally Qwen3's per-head q/k RMSNorm (`use_qk_norm`); after the
first `first_k_dense_replace` dense layers, DeepSeek-V3's MoE (sigmoid router with a selection bias,
grouped top-k, a shared expert: models/deepseek.py). The checkpoint's multi-token-prediction layers (past
num_hidden_layers) are not run."""

from __future__ import annotations

import torch

from localchat.arch.deepseek import RouterSpec
from localchat.arch.moe import MoeSpec
from localchat.backends.torch.layers import empty_param, rms_norm
from localchat.backends.torch.models.base import DecoderLM
from localchat.backends.torch.models.deepseek import SharedExpertMoe
from localchat.backends.torch.models.llama import LlamaLayer
from localchat.weights.config import ModelConfig


class Glm4MoeLayer(LlamaLayer):
    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__(config, index)
        spec = MoeSpec.from_config(config)
        sparse = index in spec.sparse_layers
        self.moe = (
            SharedExpertMoe(spec, RouterSpec.from_config(config), config.hidden_size) if sparse else None
        )
        if sparse:  # no dense gate_up/down to ask the checkpoint for
            self.gate_up = self.down = None
        # q_norm's weight repeated per q head, then k_norm's per k head (as in qwen3.py).
        self.qk_norm = (
            empty_param(self.heads + self.kv_heads, self.head_dim) if config.extra["use_qk_norm"] else None
        )

    def normalize_qk(self, qk: torch.Tensor) -> torch.Tensor:
        return qk if self.qk_norm is None else rms_norm(qk, None, self.eps) * self.qk_norm

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        return super().mlp(x) if self.moe is None else self.moe.forward(x)


class Model(DecoderLM):
    layer_class = Glm4MoeLayer
    capturable = False  # expert dispatch sizes its groups on the host (moe.py)
