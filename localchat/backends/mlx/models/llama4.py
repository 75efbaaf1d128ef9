"""Llama 4 text model on MLX (see the torch model file): L2 q/k norm on the RoPE layers, NoPE layers with the
position-dependent q temperature, sigmoid top-k routing that scales each expert's input, a shared expert,
dense layers `intermediate_size_mlp` wide."""

from __future__ import annotations

import mlx.core as mx

from localchat.arch.llama4 import moe_layers, uses_rope
from localchat.arch.moe import MoeSpec
from localchat.backends.mlx.attention import AttentionMetadata, LayerCache
from localchat.backends.mlx.layers import project, silu
from localchat.backends.mlx.models.base import DecoderLM
from localchat.backends.mlx.models.llama import LlamaLayer
from localchat.backends.mlx.models.moe import Expert, SparseMoe, WithMoe, _gather
from localchat.backends.mlx.models.smollm3 import _Still
from localchat.backends.mlx.quant import linear
from localchat.weights.config import ModelConfig


class Llama4Moe(SparseMoe):
    def __init__(self, spec: MoeSpec, hidden: int) -> None:
        super().__init__(spec, hidden)
        self.shared = Expert(hidden, spec.expert_size)

    def missing(self) -> list[str]:
        return super().missing() + [f"shared.{name}" for name in self.shared.missing()]

    def route(self, x: mx.array) -> tuple[mx.array, mx.array]:
        assert self.router is not None
        logits = linear(x, self.router).astype(mx.float32)
        ids = mx.argpartition(-logits, kth=self.top_k - 1, axis=-1)[:, : self.top_k]
        return mx.sigmoid(mx.take_along_axis(logits, ids, axis=-1)), ids

    def forward(self, x: mx.array) -> mx.array:
        assert self.gate_up is not None and self.down is not None and self.shared.down is not None
        weights, ids = self.route(x)
        rows = (x[:, None, :] * weights.astype(x.dtype)[..., None])[
            :, :, None, :
        ]  # the weight scales the input
        gate, up = mx.split(_gather(rows, self.gate_up, ids), 2, axis=-1)  # [T, k, 1, size] each
        routed = _gather(silu(gate) * up, self.down, ids)[:, :, 0, :].sum(axis=1)
        gate, up = mx.split(project(x, self.shared.gate_up), 2, axis=-1)
        return routed + linear(silu(gate) * up, self.shared.down)


class Llama4Layer(WithMoe, LlamaLayer):
    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__(config, index)
        self.qk_l2 = uses_rope(config, index) and bool(config.extra.get("use_qk_norm"))
        self.moe = None
        if index in moe_layers(config):
            self.moe = Llama4Moe(MoeSpec.from_config(config), config.hidden_size)
            for key in ("gate_up.0", "gate_up.1", "down"):
                del self.shapes[key]
        else:
            inter, hidden = (
                int(config.extra.get("intermediate_size_mlp") or config.intermediate_size),
                config.hidden_size,
            )
            self.declare("gate_up.0", inter, hidden)
            self.declare("gate_up.1", inter, hidden)
            self.declare("down", hidden, inter)

    def normalize_qk(self, q: mx.array, k: mx.array) -> tuple[mx.array, mx.array]:
        if not self.qk_l2:
            return q, k
        return mx.fast.rms_norm(q, None, self.eps), mx.fast.rms_norm(k, None, self.eps)

    def mlp(self, x: mx.array) -> mx.array:
        return super().mlp(x) if self.moe is None else self.moe.forward(x)


class Model(DecoderLM):
    layer_class = Llama4Layer
    still = _Still()
    # Image rows for the next forward (a Llama4ForConditionalGeneration's pictures over their <|patch|>
    # tokens): (rows of this step's flattened tokens, values [rows, hidden]); set and cleared by the runner.
    image_embeds: tuple[mx.array, mx.array] | None = None

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.ropes = [uses_rope(config, i) for i in range(config.num_hidden_layers)]

    def hidden_states(
        self, input_ids: mx.array, positions: mx.array, meta: AttentionMetadata, caches: list[LayerCache]
    ) -> mx.array:
        x = self.embed_tokens(input_ids)
        if self.image_embeds is not None:
            rows, values = self.image_embeds
            x[rows] = values.astype(x.dtype)
        extra = self.config.extra
        temperature = None
        if extra.get("attn_temperature_tuning"):
            floor = mx.floor((positions.astype(mx.float32) + 1.0) / float(extra["floor_scale"]))
            scale = mx.log1p(floor) * float(extra["attn_scale"]) + 1.0
            temperature = scale.astype(x.dtype)[:, None, None]  # [T, 1, 1]
        for layer, rope, cache in zip(self.layers, self.ropes, caches, strict=True):
            if rope:
                x = layer(x, self.rotary, positions, meta, cache)
            else:
                x = layer(x, self.still, positions, meta, cache, temperature)  # type: ignore[call-arg]
        return x
