"""GLM-4.5 MoE on MLX: Llama's attention (q/k/v bias, partial rotary, optional q/k RMSNorm) and, after the
leading dense layers, DeepSeek-V3's shared-expert MoE (see the torch model file)."""

from __future__ import annotations

import mlx.core as mx

from localchat.arch.deepseek import RouterSpec
from localchat.arch.moe import MoeSpec
from localchat.backends.mlx.models.base import DecoderLM
from localchat.backends.mlx.models.deepseek import SharedExpertMoe
from localchat.backends.mlx.models.llama import LlamaLayer
from localchat.backends.mlx.models.moe import WithMoe
from localchat.weights.config import ModelConfig


class Glm4MoeLayer(WithMoe, LlamaLayer):
    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__(config, index)
        spec = MoeSpec.from_config(config)
        sparse = index in spec.sparse_layers
        self.moe = (
            SharedExpertMoe(spec, RouterSpec.from_config(config), config.hidden_size) if sparse else None
        )
        if sparse:  # no dense gate_up/down to ask the checkpoint for
            for key in ("gate_up.0", "gate_up.1", "down"):
                del self.shapes[key]
        self.q_norm: mx.array | None = None
        self.k_norm: mx.array | None = None
        if config.extra["use_qk_norm"]:
            self.declare("q_norm", self.head_dim)
            self.declare("k_norm", self.head_dim)

    def normalize_qk(self, q: mx.array, k: mx.array) -> tuple[mx.array, mx.array]:
        if self.q_norm is None:
            return q, k
        return mx.fast.rms_norm(q, self.q_norm, self.eps), mx.fast.rms_norm(k, self.k_norm, self.eps)

    def mlp(self, x: mx.array) -> mx.array:
        return super().mlp(x) if self.moe is None else self.moe.forward(x)


class Model(DecoderLM):
    layer_class = Glm4MoeLayer
