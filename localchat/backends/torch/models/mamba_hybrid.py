"""Mamba-2 hybrids: Granite 4.0-H (`granitemoehybrid`) and Nemotron-H (`nemotron_h`).

`arch/ssm.py` normalises both configs into `block_kinds` (per layer: "mamba", "attention", "mlp") and
one `ssm` dict of Mamba-2 sizes, so one model file runs both:
- Granite: every layer is a mixer (Mamba-2 or GQA attention, RoPE optional, score scale
  `attention_multiplier`) then a SwiGLU `shared_mlp` (plus a top-k MoE when it has experts); residuals
  scaled by `residual_multiplier`, embeddings by `embedding_multiplier`, logits divided by `logits_scaling`.
- Nemotron-H: each block is one norm and one mixer: Mamba-2, attention (no RoPE), or a relu² MLP.
Only the Mamba-2 layers keep a state slot (mamba2.py); attention layers use the paged KV cache.
"""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from localchat.arch.moe import MoeSpec
from localchat.backends.torch.attention import AttentionOptions, paged_attention, rope_paged_attention
from localchat.backends.torch.kv_cache import KVCache
from localchat.backends.torch.layers import empty_param, rms_norm, swiglu
from localchat.backends.torch.mamba2 import Mamba2Mixer
from localchat.backends.torch.models.base import StepMetadata
from localchat.backends.torch.models.moe import SparseMoe
from localchat.backends.torch.models.partial_sums import PartialSums
from localchat.backends.torch.models.state_model import StateModel
from localchat.backends.torch.quant import linear
from localchat.backends.torch.state_cache import LayerStateShape
from localchat.weights.config import ModelConfig


class HybridBlock(PartialSums):
    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__()
        x = config.extra
        hidden = config.hidden_size
        self.eps = config.rms_norm_eps
        self.kind: str = x["block_kinds"][index]
        self.granite = config.model_type == "granitemoehybrid"
        self.attn_norm = empty_param(hidden)
        self.mamba: Mamba2Mixer | None = None
        self.qkv: nn.Parameter | None = None
        self.o: nn.Parameter | None = None
        self.up: nn.Parameter | None = None  # Nemotron-H's relu² MLP block
        self.mlp_norm: nn.Parameter | None = None
        self.gate_up: nn.Parameter | None = None  # Granite's shared SwiGLU after every mixer
        self.down: nn.Parameter | None = None
        self.moe: SparseMoe | None = None
        if self.kind == "mamba":
            s: dict[str, Any] = x["ssm"]
            self.mamba = Mamba2Mixer(
                hidden, s["heads"], s["head_dim"], s["groups"], s["d_state"], s["conv_kernel"], self.eps,
                s["conv_bias"], s["proj_bias"], float(s.get("dt_min") or 0.0),
            )  # fmt: skip
        elif self.kind == "attention":
            h, kvh, d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
            self.heads, self.kv_heads, self.head_dim = h, kvh, d
            self.qkv = empty_param((h + 2 * kvh) * d, hidden)
            self.o = empty_param(hidden, h * d)
            scale = x.get("attention_multiplier") if self.granite else None
            self.options = AttentionOptions(scale=None if scale is None else float(scale))
            self.rope = x.get("position_embedding_type") == "rope"
        else:
            self.up = empty_param(config.intermediate_size, hidden)
            self.down = empty_param(hidden, config.intermediate_size)
        if self.granite:
            shared = int(x["shared_intermediate_size"])
            self.mlp_norm = empty_param(hidden)
            self.gate_up = empty_param(2 * shared, hidden)
            self.down = empty_param(hidden, shared)
            if int(x.get("num_local_experts") or 0) > 0:
                self.moe = SparseMoe(MoeSpec.from_config(config), hidden)

    def attention(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta: StepMetadata, kv_cache: KVCache
    ) -> torch.Tensor:
        assert self.qkv is not None and self.o is not None
        tokens = x.shape[0]
        h, kvh, d = self.heads, self.kv_heads, self.head_dim
        y = linear(x, self.qkv)
        v = y[:, (h + kvh) * d :].view(tokens, kvh, d)
        if self.rope:
            qk = y[:, : (h + kvh) * d].view(tokens, h + kvh, d)
            attn = rope_paged_attention(qk, v, cos, sin, kv_cache, meta, self.options)
        else:
            q, k = y[:, : h * d].view(tokens, h, d), y[:, h * d : (h + kvh) * d].view(tokens, kvh, d)
            attn = paged_attention(q, k, v, kv_cache, meta, self.options)
        return linear(attn.reshape(tokens, h * d), self.o)

    def relu2_mlp(self, x: torch.Tensor) -> torch.Tensor:
        assert self.up is not None and self.down is not None
        return linear(F.relu(linear(x, self.up)).square(), self.down)

    def granite_mlp(self, x: torch.Tensor) -> torch.Tensor:
        assert self.gate_up is not None and self.down is not None
        out = linear(swiglu(linear(x, self.gate_up)), self.down)
        return out if self.moe is None else out + self.moe.forward(x)

    def state_shape(self) -> LayerStateShape:
        assert self.mamba is not None
        return self.mamba.state_shape()


class Model(StateModel):
    layer_class = HybridBlock

    def __init__(self, config: ModelConfig, device: torch.device) -> None:
        super().__init__(config, device)
        kinds = config.extra["block_kinds"]
        self.num_kv_layers = sum(1 for k in kinds if k == "attention")
        self.granite = config.model_type == "granitemoehybrid"
        self.residual_scale = float(config.extra.get("residual_multiplier") or 1.0) if self.granite else 1.0

    @property
    def blocks(self) -> list[HybridBlock]:
        return [cast(HybridBlock, layer) for layer in self.layers]

    def state_shapes(self) -> list[LayerStateShape]:
        return [b.state_shape() for b in self.blocks if b.kind == "mamba"]

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = super().embed_tokens(input_ids)
        scale = float(self.config.extra.get("embedding_multiplier") or 1.0) if self.granite else 1.0
        return x if scale == 1.0 else x * scale

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        out = super().logits(hidden)
        scale = float(self.config.extra.get("logits_scaling") or 1.0) if self.granite else 1.0
        return out if scale == 1.0 else out / scale

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: StepMetadata,
        kv_caches: list[KVCache],
    ) -> torch.Tensor:
        rows, states = self.bound()
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary(positions, x.dtype)
        kv_index = state_index = 0
        for block in self.blocks:
            normed = rms_norm(x, block.attn_norm, block.eps)
            if block.mamba is not None:
                out = block.mamba.forward(
                    normed, rows, states.conv[state_index], states.recurrent[state_index]
                )
                state_index += 1
            elif block.kind == "attention":
                out = block.attention(normed, cos, sin, meta, kv_caches[kv_index])
                kv_index += 1
            else:
                out = block.relu2_mlp(normed)
            # Every mixer ends in a row-parallel projection (out_proj, o, down): one sum each.
            x = x + block.reduce_partial(out) * self.residual_scale
            if block.mlp_norm is not None:
                mlp = block.granite_mlp(rms_norm(x, block.mlp_norm, block.eps))
                x = x + block.reduce_partial(mlp) * self.residual_scale  # shared MLP + MoE: one sum
        return x
