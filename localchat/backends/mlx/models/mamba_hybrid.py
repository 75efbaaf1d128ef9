"""Mamba-2 hybrids on MLX, as localchat/backends/torch/models/mamba_hybrid.py computes them (read its
docstring): Granite 4.0-H (`granitemoehybrid`: Mamba-2 or attention, then the shared SwiGLU MLP plus an
optional top-k MoE, with its multipliers) and Nemotron-H (`nemotron_h`: one norm and one mixer per block -
Mamba-2, attention without RoPE, or a relu² MLP). Mamba-2 states live in slots (mamba2.py).
"""

from __future__ import annotations

from typing import Any, cast

import mlx.core as mx

from localchat.arch.moe import MoeSpec
from localchat.backends.mlx.attention import AttentionMetadata, LayerCache, paged_attention
from localchat.backends.mlx.layers import Rotary, project, silu
from localchat.backends.mlx.mamba2 import Mamba2Mixer
from localchat.backends.mlx.models.moe import SparseMoe, WithMoe
from localchat.backends.mlx.models.state_model import StateModel
from localchat.backends.mlx.quant import Weight, linear
from localchat.backends.mlx.state_cache import LayerStateShape
from localchat.weights.config import ModelConfig


class HybridBlock(WithMoe):
    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__(config, index)
        x = config.extra
        hidden = config.hidden_size
        self.eps = config.rms_norm_eps
        self.kind: str = x["block_kinds"][index]
        self.granite = config.model_type == "granitemoehybrid"
        self.moe: SparseMoe | None = None
        self.mlp_norm: mx.array | None = None
        self.gate_up: Weight | list[Weight] | None = None  # Granite's shared SwiGLU after every mixer
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
            scale = x.get("attention_multiplier") if self.granite else None
            self.scale = d**-0.5 if scale is None else float(scale)
            self.rope = x.get("position_embedding_type") == "rope"
        else:
            self.declare("up", config.intermediate_size, hidden)
            self.declare("down", hidden, config.intermediate_size)
        if self.granite:
            shared = int(x["shared_intermediate_size"])
            self.declare("mlp_norm", hidden)
            self.declare("gate_up", 2 * shared, hidden)
            self.declare("down", hidden, shared)
            if int(x.get("num_local_experts") or 0) > 0:
                self.moe = SparseMoe(MoeSpec.from_config(config), hidden)

    def missing(self) -> list[str]:
        return super().missing() + (
            [f"mamba.{name}" for name in self.mamba.missing()] if self.mamba is not None else []
        )

    def attention(
        self, x: mx.array, rotary: Rotary, positions: mx.array, meta: AttentionMetadata, cache: LayerCache
    ) -> mx.array:
        assert self.o is not None
        tokens = x.shape[0]
        h, kvh, d = self.heads, self.kv_heads, self.head_dim
        qkv = project(x, self.qkv).reshape(tokens, h + 2 * kvh, d)
        q, k = qkv[:, :h], qkv[:, h : h + kvh]
        if self.rope:
            q, k = rotary(q, positions), rotary(k, positions)
        attn = paged_attention(q, k, qkv[:, h + kvh :], cache, meta, self.scale, None)
        return linear(attn.reshape(tokens, h * d), self.o)

    def granite_mlp(self, x: mx.array) -> mx.array:
        assert self.down is not None
        gate, up = mx.split(project(x, self.gate_up), 2, axis=-1)
        out = linear(silu(gate) * up, self.down)
        return out if self.moe is None else out + self.moe.forward(x)

    def relu2_mlp(self, x: mx.array) -> mx.array:
        assert self.up is not None and self.down is not None
        return linear(mx.square(mx.maximum(linear(x, self.up), 0)), self.down)

    def state_shape(self) -> LayerStateShape:
        assert self.mamba is not None
        return self.mamba.state_shape()


class Model(StateModel):
    layer_class = HybridBlock

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.num_kv_layers = sum(1 for k in config.extra["block_kinds"] if k == "attention")
        self.granite = config.model_type == "granitemoehybrid"
        self.residual_scale = float(config.extra.get("residual_multiplier") or 1.0) if self.granite else 1.0

    def embed_tokens(self, input_ids: mx.array) -> mx.array:
        x = super().embed_tokens(input_ids)
        scale = float(self.config.extra.get("embedding_multiplier") or 1.0) if self.granite else 1.0
        return x if scale == 1.0 else x * scale

    def logits(self, hidden: mx.array) -> mx.array:
        out = super().logits(hidden)
        scale = float(self.config.extra.get("logits_scaling") or 1.0) if self.granite else 1.0
        return out if scale == 1.0 else out / scale

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
                out = block.mamba.forward(
                    normed, rows, states.conv[state_index], states.recurrent[state_index]
                )
                state_index += 1
            elif block.kind == "attention":
                out = block.attention(normed, self.rotary, positions, meta, caches[kv_index])
                kv_index += 1
            else:
                out = block.relu2_mlp(normed)
            x = x + out * self.residual_scale
            if block.mlp_norm is not None:
                x = (
                    x
                    + block.granite_mlp(mx.fast.rms_norm(x, block.mlp_norm, block.eps)) * self.residual_scale
                )
        return x
