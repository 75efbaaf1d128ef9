"""gpt-oss: Llama-shaped attention with q/k/v/o biases, per-head attention sinks and a sliding window
on every other layer (attention.py's `AttentionOptions`), and a mixture of clamped-SwiGLU experts with
biases behind a biased top-k router (arch/gpt_oss.py has the checkpoint layout).

Decode with sinks runs in torch: the compiled attention kernels have no sink term.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from localchat.arch.moe import MoeSpec
from localchat.backends.torch.attention import AttentionOptions
from localchat.backends.torch.layers import empty_param
from localchat.backends.torch.models.base import DecoderLM
from localchat.backends.torch.models.llama import LlamaLayer
from localchat.backends.torch.quant import Weight, linear
from localchat.weights.config import ModelConfig


class Expert(nn.Module):
    def __init__(self, hidden: int, size: int) -> None:
        super().__init__()
        self.gate_up: Weight = empty_param(2 * size, hidden)  # gate rows, then up rows
        self.gate_up_bias = empty_param(2 * size)
        self.down: Weight = empty_param(hidden, size)
        self.down_bias = empty_param(hidden)


class GptOssMoe(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        spec = MoeSpec.from_config(config)
        self.top_k = spec.top_k
        self.limit = float(config.extra.get("swiglu_limit", 7.0))
        self.alpha = float(config.extra.get("swiglu_alpha", 1.702))
        self.router = empty_param(spec.experts, config.hidden_size)
        self.router_bias = empty_param(spec.experts)
        self.experts = nn.ModuleList(
            Expert(config.hidden_size, spec.expert_size) for _ in range(spec.experts)
        )

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, hidden] -> (weights [T, k]: softmax over the k largest logits, expert ids [T, k])."""
        logits = linear(x, self.router, self.router_bias).float()
        top, ids = logits.topk(self.top_k, dim=-1)
        return top.softmax(dim=-1).to(x.dtype), ids

    def expert(self, expert: Expert, x: torch.Tensor) -> torch.Tensor:
        gate, up = linear(x, expert.gate_up, expert.gate_up_bias).chunk(2, dim=-1)
        gate = gate.clamp(max=self.limit)
        up = up.clamp(min=-self.limit, max=self.limit)
        return linear((up + 1) * gate * torch.sigmoid(gate * self.alpha), expert.down, expert.down_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.route(x)
        experts = cast(list[Expert], list(self.experts))
        flat = ids.flatten()
        order = flat.argsort(stable=True)  # (token, expert) pairs grouped by expert
        token = order // self.top_k
        counts = torch.bincount(flat, minlength=len(experts)).tolist()  # one host sync per layer
        rows = x[token]
        out = torch.empty_like(rows)
        start = 0
        for expert, count in zip(experts, counts, strict=True):
            if count:
                out[start : start + count] = self.expert(expert, rows[start : start + count])
                start += count
        out *= weights.flatten()[order, None]
        return torch.zeros_like(x).index_add_(0, token, out)


class GptOssLayer(LlamaLayer):
    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__(config, index)
        self.gate_up = self.down = None  # every layer is sparse
        self.moe = GptOssMoe(config)
        self.sinks = empty_param(config.num_attention_heads)
        kinds = config.extra.get("layer_types") or []
        slides = index < len(kinds) and kinds[index] == "sliding_attention"
        self.window = config.sliding_window if slides else None

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        return self.moe.forward(x)


class Model(DecoderLM):
    layer_class = GptOssLayer
    capturable = False  # expert dispatch sizes its groups on the host

    def after_load(self) -> None:
        # The loader replaces the sinks parameter, so the options naming it are built once it is in
        # place; the layers keep Llama's forward (and with it the tensor-parallel sums).
        for layer in cast(list[GptOssLayer], list(self.layers)):
            layer.attn_options = AttentionOptions(window=layer.window, sinks=layer.sinks)
