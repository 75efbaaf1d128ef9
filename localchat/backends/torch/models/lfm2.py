"""LFM2 (Liquid): short-convolution layers interleaved with GQA attention (`layer_types`: "conv" or
"full_attention"), each followed by a SwiGLU MLP.

- Short conv: in_proj gives B | C | x (hidden each); y = C * conv(B * x) with a depthwise causal conv of
  width `conv_L_cache` (no activation); out_proj. Its last K - 1 inputs are the per-sequence state.
- Attention: q/k RMSNorm per head, full RoPE; the paged KV cache holds K/V of these layers only.
- LFM2-MoE (`lfm2_moe`): the same layers; after the first `num_dense_layers` the MLP is a sparse MoE
  with a sigmoid router whose expert bias steers only the choice.
- The final norm is `embedding_norm` (applied after the layers, despite its name).
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from localchat.arch.moe import MoeSpec
from localchat.backends.torch.attention import rope_paged_attention
from localchat.backends.torch.kv_cache import KVCache
from localchat.backends.torch.layers import empty_param, rms_norm, swiglu
from localchat.backends.torch.models.base import StepMetadata
from localchat.backends.torch.models.moe import SparseMoe
from localchat.backends.torch.models.partial_sums import PartialSums
from localchat.backends.torch.models.state_model import StateModel
from localchat.backends.torch.quant import linear
from localchat.backends.torch.short_conv import causal_conv
from localchat.backends.torch.state_cache import LayerStateShape, StepRows
from localchat.weights.config import ModelConfig


class SigmoidRouterMoe(SparseMoe):
    """LFM2-MoE's experts: sigmoid scores; the top k chosen by score + a per-expert bias (the bias only
    steers the choice), their scores renormalised (+ 1e-6, as the reference) and scaled."""

    def __init__(self, spec: MoeSpec, hidden: int, scale: float, use_bias: bool) -> None:
        super().__init__(spec, hidden)
        self.scale = scale
        self.score_bias = empty_param(spec.experts) if use_bias else None

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = torch.sigmoid(linear(x, self.router).float())
        choice = scores if self.score_bias is None else scores + self.score_bias.float()
        ids = choice.topk(self.top_k, dim=-1).indices
        weights = scores.gather(1, ids)
        if self.renormalize:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-6)
        return (weights * self.scale).to(x.dtype), ids


class Lfm2Layer(PartialSums):
    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__()
        x = config.extra
        hidden = config.hidden_size
        self.eps = config.rms_norm_eps
        self.is_conv = x["layer_types"][index] == "conv"
        self.attn_norm = empty_param(hidden)
        self.mlp_norm = empty_param(hidden)
        self.gate_up: nn.Parameter | None = empty_param(2 * config.intermediate_size, hidden)
        self.down: nn.Parameter | None = empty_param(hidden, config.intermediate_size)
        self.moe: SigmoidRouterMoe | None = None
        if config.model_type == "lfm2_moe" and index >= int(x["num_dense_layers"]):
            scale, use_bias = float(x["routed_scaling_factor"]), bool(x["use_expert_bias"])
            self.moe = SigmoidRouterMoe(MoeSpec.from_config(config), hidden, scale, use_bias)
            self.gate_up = self.down = None  # no dense MLP to ask the checkpoint for
        if self.is_conv:
            channels = int(x.get("conv_channels") or hidden)  # a tensor-parallel rank's share of hidden
            self.in_proj = empty_param(3 * channels, hidden)
            self.conv = empty_param(channels, 1, x["conv_L_cache"])
            self.out = empty_param(hidden, channels)
            bias = bool(x.get("conv_bias"))
            self.in_proj_bias = empty_param(3 * channels) if bias else None
            self.conv_bias = empty_param(channels) if bias else None
            self.out_bias = empty_param(hidden) if bias else None
        else:
            h, kvh, d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
            self.heads, self.kv_heads, self.head_dim = h, kvh, d
            self.qkv = empty_param((h + 2 * kvh) * d, hidden)
            self.qk_norm = empty_param(h + kvh, d)
            self.o = empty_param(hidden, h * d)

    def state_shape(self) -> LayerStateShape:
        return LayerStateShape(self.conv.shape[0], self.conv.shape[-1] - 1, 0, 0, 0)  # a window only

    def short_conv(self, x: torch.Tensor, rows: StepRows, windows: torch.Tensor) -> torch.Tensor:
        hidden = self.conv.shape[0]  # channels: hidden, or a tensor-parallel rank's share
        y = linear(x, self.in_proj)
        if self.in_proj_bias is not None:
            y = y + self.in_proj_bias
        b, c, v = y[:, :hidden], y[:, hidden : 2 * hidden], y[:, 2 * hidden :]
        conv = causal_conv((b * v).contiguous(), rows, windows, self.conv[:, 0, :], self.conv_bias)
        out = linear((c * conv).contiguous(), self.out)
        return out if self.out_bias is None else out + self.out_bias

    def attention(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta: StepMetadata, kv_cache: KVCache
    ) -> torch.Tensor:
        tokens = x.shape[0]
        h, kvh, d = self.heads, self.kv_heads, self.head_dim
        y = linear(x, self.qkv)
        qk = rms_norm(y[:, : (h + kvh) * d].view(tokens, h + kvh, d), None, self.eps) * self.qk_norm
        v = y[:, (h + kvh) * d :].view(tokens, kvh, d)
        attn = rope_paged_attention(qk, v, cos, sin, kv_cache, meta)
        return linear(attn.reshape(tokens, h * d), self.o)

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        if self.moe is not None:
            return self.moe.forward(x)
        assert self.gate_up is not None and self.down is not None
        return linear(swiglu(linear(x, self.gate_up)), self.down)


class Model(StateModel):
    layer_class = Lfm2Layer

    def __init__(self, config: ModelConfig, device: torch.device) -> None:
        super().__init__(config, device)
        self.num_kv_layers = sum(1 for layer in self.lfm2_layers if not layer.is_conv)

    @property
    def lfm2_layers(self) -> list[Lfm2Layer]:
        return [cast(Lfm2Layer, layer) for layer in self.layers]

    def state_shapes(self) -> list[LayerStateShape]:
        return [layer.state_shape() for layer in self.lfm2_layers if layer.is_conv]

    def mixer(
        self,
        layer: Lfm2Layer,
        normed: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: StepMetadata,
        kv_caches: list[KVCache],
        index: list[int],
    ) -> torch.Tensor:
        """The layer's conv (state slot index[1]) or attention (KV cache index[0]); advances the index."""
        rows, states = self.bound()
        if layer.is_conv:
            index[1] += 1
            return layer.short_conv(normed, rows, states.conv[index[1] - 1])
        index[0] += 1
        return layer.attention(normed, cos, sin, meta, kv_caches[index[0] - 1])

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: StepMetadata,
        kv_caches: list[KVCache],
    ) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary(positions, x.dtype)
        index = [0, 0]  # next KV cache, next state slot layer
        for layer in self.lfm2_layers:
            normed = rms_norm(x, layer.attn_norm, layer.eps)
            # The conv's out_proj, attention's o and the MLP's down are row-parallel: one sum each.
            x = x + layer.reduce_partial(self.mixer(layer, normed, cos, sin, meta, kv_caches, index))
            x = x + layer.reduce_partial(layer.mlp(rms_norm(x, layer.mlp_norm, layer.eps)))
        return x
