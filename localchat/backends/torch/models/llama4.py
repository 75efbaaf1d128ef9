"""Llama 4 (Scout, Maverick) text model: Llama's layer with Llama 4's details (localchat/arch/llama4.py):

- RoPE layers normalise q and k per head (L2, no weight: `use_qk_norm`); RMS is rotation-invariant, so
  it runs before RoPE here (LlamaLayer.normalize_qk) with the same result;
- NoPE layers (every 4th) turn nothing (cos 1, sin 0) and scale q by a temperature that grows with the
  position, 1 + attn_scale * log(1 + floor((position + 1) / floor_scale));
- MoE layers: each token's top-k experts by router logit, weighted by the sigmoid of that logit, which
  scales the expert's *input*; plus a shared expert every token takes. Dense layers are
  `intermediate_size_mlp` wide.
"""

from __future__ import annotations

from typing import cast

import torch

from localchat.arch.llama4 import moe_layers, uses_rope
from localchat.arch.moe import MoeSpec
from localchat.backends.torch.kv_cache import KVCache
from localchat.backends.torch.layers import empty_param, rms_norm, swiglu
from localchat.backends.torch.models.base import DecoderLM, StepMetadata
from localchat.backends.torch.models.llama import LlamaLayer
from localchat.backends.torch.models.moe import Expert, SparseMoe
from localchat.backends.torch.quant import linear
from localchat.weights.config import ModelConfig


class Llama4Moe(SparseMoe):
    def __init__(self, spec: MoeSpec, hidden: int) -> None:
        super().__init__(spec, hidden)
        self.shared = Expert(hidden, spec.expert_size)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        top = linear(x, self.router).float().topk(self.top_k, dim=-1)
        return top.values.sigmoid().to(x.dtype), top.indices

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.route(x)
        experts = cast(list[Expert], list(self.experts))
        flat = ids.flatten()
        order = flat.argsort(stable=True)  # (token, expert) pairs grouped by expert
        token = order // self.top_k
        counts = torch.bincount(flat, minlength=len(experts)).tolist()  # NOTE: a host sync per layer
        rows = x[token] * weights.flatten()[order, None]  # the router weight scales the expert's input
        out = torch.empty_like(rows)
        start = 0
        for expert, count in zip(experts, counts, strict=True):
            if count:
                end = start + count
                out[start:end] = linear(swiglu(linear(rows[start:end], expert.gate_up)), expert.down)
                start = end
        shared = linear(swiglu(linear(x, self.shared.gate_up)), self.shared.down)
        return shared.index_add_(0, token, out)


class Llama4Layer(LlamaLayer):
    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__(config, index)
        self.rope = uses_rope(config, index)
        self.qk_l2 = self.rope and bool(config.extra.get("use_qk_norm"))
        self.moe = None
        if index in moe_layers(config):
            self.moe = Llama4Moe(MoeSpec.from_config(config), config.hidden_size)
            self.gate_up = self.down = None
        else:
            inter = int(config.extra.get("intermediate_size_mlp") or config.intermediate_size)
            self.gate_up, self.down = (
                empty_param(2 * inter, config.hidden_size),
                empty_param(config.hidden_size, inter),
            )

    def normalize_qk(self, qk: torch.Tensor) -> torch.Tensor:
        return rms_norm(qk, None, self.eps) if self.qk_l2 else qk

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        return super().mlp(x) if self.moe is None else self.moe.forward(x)


class Model(DecoderLM):
    layer_class = Llama4Layer
    capturable = False  # expert dispatch sizes its groups on the host
    # Image rows for the next forward (a Llama4ForConditionalGeneration's pictures over their <|patch|>
    # tokens): (rows of this step's flattened tokens, values [rows, hidden]); set and cleared by the runner.
    image_embeds: tuple[torch.Tensor, torch.Tensor] | None = None

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: StepMetadata,
        kv_caches: list[KVCache],
    ) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        if self.image_embeds is not None:
            rows, values = self.image_embeds
            x = x.index_copy(0, rows, values.to(x.dtype))
        cos, sin = self.rotary(positions, x.dtype)
        still = torch.ones_like(cos), torch.zeros_like(sin)  # NoPE layers: the identity rotation
        extra = self.config.extra
        temperature = None
        if extra.get("attn_temperature_tuning"):
            floor = torch.floor((positions.float() + 1.0) / float(extra["floor_scale"]))
            temperature = (torch.log1p(floor) * float(extra["attn_scale"]) + 1.0).to(x.dtype)[:, None, None]
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            if layer.rope:
                x = layer.forward(x, cos, sin, meta, kv_cache)
            else:
                x = layer.forward(x, *still, meta, kv_cache, temperature)
        return x
