"""Nemotron-H (`nemotron_h`) on MLX: one norm and one mixer per block by `block_kinds` (arch/ssm.py) -
Mamba-2 (mamba2.py, its state in a slot), attention without RoPE (the paged KV cache), or a relu² MLP -
as localchat/backends/torch/models/mamba_hybrid.py computes it. Granite 4.0-H is torch-only so far.
"""

from __future__ import annotations

from typing import Any, cast

import mlx.core as mx

from localchat.backends.mlx.attention import AttentionMetadata, LayerCache, paged_attention
from localchat.backends.mlx.layers import project
from localchat.backends.mlx.mamba2 import Mamba2Mixer
from localchat.backends.mlx.models.base import Layer
from localchat.backends.mlx.models.state_model import StateModel
from localchat.backends.mlx.quant import Weight, linear
from localchat.backends.mlx.state_cache import LayerStateShape
from localchat.errors import UnsupportedArchitectureError
from localchat.weights.config import ModelConfig


class HybridBlock(Layer):
    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__(config, index)
        x = config.extra
        hidden = config.hidden_size
        self.eps = config.rms_norm_eps
        self.kind: str = x["block_kinds"][index]
        self.attn_norm: mx.array | None = None
        self.declare("attn_norm", hidden)
        self.mamba: Mamba2Mixer | None = None
        self.qkv: Weight | list[Weight] | None = None
        self.o: Weight | None = None
        self.up: Weight | None = None
        self.down: Weight | None = None
        if self.kind == "mamba":
            s: dict[str, Any] = x["ssm"]
            self.mamba = Mamba2Mixer(
                hidden,
                s["heads"],
                s["head_dim"],
                s["groups"],
                s["d_state"],
                s["conv_kernel"],
                self.eps,
                s["conv_bias"],
                s["proj_bias"],
                float(s.get("dt_min") or 0.0),
            )  # the mixer declares its own arrays
        elif self.kind == "attention":
            h, kvh, d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
            self.heads, self.kv_heads, self.head_dim = h, kvh, d
            for part, rows in enumerate((h * d, kvh * d, kvh * d)):
                self.declare(f"qkv.{part}", rows, hidden)
            self.declare("o", hidden, h * d)
        else:
            self.declare("up", config.intermediate_size, hidden)
            self.declare("down", hidden, config.intermediate_size)

    def missing(self) -> list[str]:
        return super().missing() + (
            [f"mamba.{name}" for name in self.mamba.missing()] if self.mamba is not None else []
        )

    def attention(self, x: mx.array, meta: AttentionMetadata, cache: LayerCache) -> mx.array:
        assert self.o is not None
        tokens = x.shape[0]
        h, kvh, d = self.heads, self.kv_heads, self.head_dim
        qkv = project(x, self.qkv).reshape(tokens, h + 2 * kvh, d)
        attn = paged_attention(qkv[:, :h], qkv[:, h : h + kvh], qkv[:, h + kvh :], cache, meta, d**-0.5, None)
        return linear(attn.reshape(tokens, h * d), self.o)

    def relu2_mlp(self, x: mx.array) -> mx.array:
        assert self.up is not None and self.down is not None
        return linear(mx.square(mx.maximum(linear(x, self.up), 0)), self.down)

    def state_shape(self) -> LayerStateShape:
        assert self.mamba is not None
        return self.mamba.state_shape()


class Model(StateModel):
    layer_class = HybridBlock

    def __init__(self, config: ModelConfig) -> None:
        if config.model_type != "nemotron_h":
            raise UnsupportedArchitectureError(
                f"{config.model_type} on the MLX backend (use --backend torch)",
                ["nemotron_h", "lfm2", "qwen3_5_text"],
            )
        super().__init__(config)
        self.num_kv_layers = sum(1 for k in config.extra["block_kinds"] if k == "attention")

    @property
    def blocks(self) -> list[HybridBlock]:
        return [cast(HybridBlock, layer) for layer in self.layers]

    def state_shapes(self) -> list[LayerStateShape]:
        return [b.state_shape() for b in self.blocks if b.kind == "mamba"]

    def hidden_states(
        self, input_ids: mx.array, positions: mx.array, meta: AttentionMetadata, caches: list[LayerCache]
    ) -> mx.array:
        rows, states = self.bound()
        x = self.embed_tokens(input_ids)
        kv_index = state_index = 0
        for block in self.blocks:
            normed = mx.fast.rms_norm(x, block.attn_norm, block.eps)
            if block.mamba is not None:
                x = x + block.mamba.forward(
                    normed, rows, states.conv[state_index], states.recurrent[state_index]
                )
                state_index += 1
            elif block.kind == "attention":
                x = x + block.attention(normed, meta, caches[kv_index])
                kv_index += 1
            else:
                x = x + block.relu2_mlp(normed)
        return x
