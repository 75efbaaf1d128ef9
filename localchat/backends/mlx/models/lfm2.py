"""LFM2 (Liquid) on MLX: short-convolution layers interleaved with GQA attention (`layer_types`), each
followed by a SwiGLU MLP, as localchat/backends/torch/models/lfm2.py computes it (read its docstring).
The conv windows live in state slots; the paged KV cache holds the attention layers' K/V only.
LFM2-MoE: after `num_dense_layers` the MLP is a sparse MoE with a sigmoid router.
"""

from __future__ import annotations

from typing import cast

import mlx.core as mx

from localchat.arch.moe import MoeSpec
from localchat.backends.mlx.attention import AttentionMetadata, LayerCache, paged_attention
from localchat.backends.mlx.layers import Rotary, project, silu
from localchat.backends.mlx.models.moe import SparseMoe, WithMoe
from localchat.backends.mlx.models.state_model import StateModel
from localchat.backends.mlx.quant import Weight, linear
from localchat.backends.mlx.short_conv import causal_conv
from localchat.backends.mlx.state_cache import LayerStateShape, StepRows
from localchat.weights.config import ModelConfig


class SigmoidRouterMoe(SparseMoe):
    """LFM2-MoE's experts: sigmoid scores; the top k chosen by score + a per-expert bias (the bias only
    steers the choice), their scores renormalised (+ 1e-6, as the reference) and scaled."""

    def __init__(self, spec: MoeSpec, hidden: int, scale: float, use_bias: bool) -> None:
        super().__init__(spec, hidden)
        self.scale = scale
        self.score_bias: mx.array | None = None
        if use_bias:
            self.declare("score_bias", spec.experts)

    def route(self, x: mx.array) -> tuple[mx.array, mx.array]:
        assert self.router is not None
        scores = mx.sigmoid(linear(x, self.router).astype(mx.float32))
        choice = scores if self.score_bias is None else scores + self.score_bias.astype(mx.float32)
        ids = mx.argpartition(-choice, kth=self.top_k - 1, axis=-1)[:, : self.top_k]
        weights = mx.take_along_axis(scores, ids, axis=-1)
        if self.renormalize:
            weights = weights / (weights.sum(axis=-1, keepdims=True) + 1e-6)
        return weights * self.scale, ids


class Lfm2Layer(WithMoe):
    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__(config, index)
        x = config.extra
        hidden, inter = config.hidden_size, config.intermediate_size
        self.eps = config.rms_norm_eps
        self.is_conv = x["layer_types"][index] == "conv"
        self.attn_norm: mx.array | None = None
        self.mlp_norm: mx.array | None = None
        self.gate_up: Weight | list[Weight] | None = None
        self.down: Weight | None = None
        self.declare("attn_norm", hidden)
        self.declare("mlp_norm", hidden)
        self.declare("gate_up.0", inter, hidden)
        self.declare("gate_up.1", inter, hidden)
        self.declare("down", hidden, inter)
        self.moe: SigmoidRouterMoe | None = None
        if config.model_type == "lfm2_moe" and index >= int(x["num_dense_layers"]):
            scale, use_bias = float(x["routed_scaling_factor"]), bool(x["use_expert_bias"])
            self.moe = SigmoidRouterMoe(MoeSpec.from_config(config), hidden, scale, use_bias)
            for key in ("gate_up.0", "gate_up.1", "down"):  # no dense MLP to ask the checkpoint for
                del self.shapes[key]
        if self.is_conv:
            self.kernel = int(x["conv_L_cache"])
            self.in_proj: Weight | None = None
            self.conv: mx.array | None = None
            self.out: Weight | None = None
            self.in_proj_bias: mx.array | None = None
            self.conv_bias: mx.array | None = None
            self.out_bias: mx.array | None = None
            self.declare("in_proj", 3 * hidden, hidden)
            self.declare("conv", hidden, 1, self.kernel)
            self.declare("out", hidden, hidden)
            if x.get("conv_bias"):
                self.declare("in_proj_bias", 3 * hidden)
                self.declare("conv_bias", hidden)
                self.declare("out_bias", hidden)
        else:
            h, kvh, d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
            self.heads, self.kv_heads, self.head_dim = h, kvh, d
            self.qkv: Weight | list[Weight] | None = None
            self.q_norm: mx.array | None = None
            self.k_norm: mx.array | None = None
            self.o: Weight | None = None
            for part, rows in enumerate((h * d, kvh * d, kvh * d)):
                self.declare(f"qkv.{part}", rows, hidden)
            self.declare("q_norm", d)
            self.declare("k_norm", d)
            self.declare("o", hidden, h * d)

    def state_shape(self) -> LayerStateShape:
        return LayerStateShape(self.shapes["conv"][0], self.kernel - 1, 0, 0, 0)  # a window only

    def short_conv(self, x: mx.array, rows: StepRows, windows: mx.array) -> mx.array:
        assert self.in_proj is not None and self.conv is not None and self.out is not None
        hidden = x.shape[1]
        y = linear(x, self.in_proj, self.in_proj_bias)
        b, c, v = y[:, :hidden], y[:, hidden : 2 * hidden], y[:, 2 * hidden :]
        conv = causal_conv(b * v, rows, windows, self.conv[:, 0, :], self.conv_bias)
        return linear(c * conv, self.out, self.out_bias)

    def attention(
        self, x: mx.array, rotary: Rotary, positions: mx.array, meta: AttentionMetadata, cache: LayerCache
    ) -> mx.array:
        tokens = x.shape[0]
        h, kvh, d = self.heads, self.kv_heads, self.head_dim
        qkv = project(x, self.qkv).reshape(tokens, h + 2 * kvh, d)
        q = mx.fast.rms_norm(qkv[:, :h], self.q_norm, self.eps)
        k = mx.fast.rms_norm(qkv[:, h : h + kvh], self.k_norm, self.eps)
        q, k = rotary(q, positions), rotary(k, positions)
        attn = paged_attention(q, k, qkv[:, h + kvh :], cache, meta, d**-0.5, None)
        assert self.o is not None
        return linear(attn.reshape(tokens, h * d), self.o)

    def mlp(self, x: mx.array) -> mx.array:
        if self.moe is not None:
            return self.moe.forward(x)
        assert self.down is not None
        gate, up = mx.split(project(x, self.gate_up), 2, axis=-1)
        return linear(silu(gate) * up, self.down)


class Model(StateModel):
    layer_class = Lfm2Layer

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.num_kv_layers = sum(1 for layer in self.lfm2_layers if not layer.is_conv)

    @property
    def lfm2_layers(self) -> list[Lfm2Layer]:
        return [cast(Lfm2Layer, layer) for layer in self.layers]

    def state_shapes(self) -> list[LayerStateShape]:
        return [layer.state_shape() for layer in self.lfm2_layers if layer.is_conv]

    def hidden_states(
        self, input_ids: mx.array, positions: mx.array, meta: AttentionMetadata, caches: list[LayerCache]
    ) -> mx.array:
        rows, states = self.bound()
        x = self.embed_tokens(input_ids)
        kv_index = state_index = 0
        for layer in self.lfm2_layers:
            normed = mx.fast.rms_norm(x, layer.attn_norm, layer.eps)
            if layer.is_conv:
                x = x + layer.short_conv(normed, rows, states.conv[state_index])
                state_index += 1
            else:
                x = x + layer.attention(normed, self.rotary, positions, meta, caches[kv_index])
                kv_index += 1
            x = x + layer.mlp(mx.fast.rms_norm(x, layer.mlp_norm, layer.eps))
        return x
