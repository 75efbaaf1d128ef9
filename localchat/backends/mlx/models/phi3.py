"""Phi-3 / Phi-3.5-mini, Phi-4-mini: Llama's layer on checkpoints that store q|k|v and gate|up already
fused (one array each instead of parts). Partial rotary and longrope live in `Rotary`."""

from __future__ import annotations

from localchat.backends.mlx.models.base import DecoderLM
from localchat.backends.mlx.models.llama import LlamaLayer
from localchat.weights.config import ModelConfig


class Phi3Layer(LlamaLayer):
    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__(config, index)
        h, kvh, d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        for name in ("qkv.0", "qkv.1", "qkv.2", "gate_up.0", "gate_up.1"):
            del self.shapes[name]
        self.declare("qkv", (h + 2 * kvh) * d, config.hidden_size)
        self.declare("gate_up", 2 * config.intermediate_size, config.hidden_size)


class Model(DecoderLM):
    layer_class = Phi3Layer
