"""The sparse mixture-of-experts feed-forward block that Mixtral and Qwen3-MoE layers use.

router linear -> softmax -> top-k (renormalised where the spec says) -> each chosen expert's SwiGLU on
the token -> the weighted sum. Dispatch is batched: the step's (token, expert) pairs are sorted by expert
and each expert that got tokens runs once, as two matmuls over its gathered rows; the results scatter
back with one index_add. Experts are ordinary per-expert matrices, so a GGUF file's quantized experts
stay in their blocks (quant.py) like any other linear.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from localchat.arch.moe import MoeSpec
from localchat.backends.torch.layers import empty_param, swiglu
from localchat.backends.torch.models.llama import LlamaLayer
from localchat.backends.torch.quant import Weight, linear
from localchat.weights.config import ModelConfig


class Expert(nn.Module):
    def __init__(self, hidden: int, size: int) -> None:
        super().__init__()
        self.gate_up: Weight = empty_param(2 * size, hidden)  # packed forms replace them at load
        self.down: Weight = empty_param(hidden, size)


class SparseMoe(nn.Module):
    def __init__(self, spec: MoeSpec, hidden: int) -> None:
        super().__init__()
        self.top_k, self.renormalize = spec.top_k, spec.renormalize
        self.router = empty_param(spec.experts, hidden)
        self.experts = nn.ModuleList(Expert(hidden, spec.expert_size) for _ in range(spec.experts))

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, hidden] -> (weights [T, k] in x's dtype, expert ids [T, k])."""
        probs = torch.softmax(linear(x, self.router).float(), dim=-1)
        weights, ids = probs.topk(self.top_k, dim=-1)
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), ids

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.route(x)
        experts = cast(list[Expert], list(self.experts))
        if x.shape[0] == 1:  # one decode row: its k experts directly, no sort/gather/scatter
            out = torch.zeros_like(x)
            for weight, e in zip(weights[0], ids[0].tolist(), strict=True):
                out += weight * linear(swiglu(linear(x, experts[e].gate_up)), experts[e].down)
            return out
        flat = ids.flatten()
        order = flat.argsort(stable=True)  # pairs grouped by expert
        token = order // self.top_k  # the token of each sorted pair
        # NOTE: one host sync per layer for the group sizes; CUDA graphs are off for MoE models (runner).
        counts = torch.bincount(flat, minlength=len(self.experts)).tolist()
        rows = x[token]
        out = torch.empty_like(rows)
        start = 0
        for expert, count in zip(experts, counts, strict=True):
            if count:
                end = start + count
                out[start:end] = linear(swiglu(linear(rows[start:end], expert.gate_up)), expert.down)
                start = end
        out *= weights.flatten()[order, None]
        return torch.zeros_like(x).index_add_(0, token, out)


class MoeLayer(LlamaLayer):
    """A Llama layer whose MLP is a SparseMoe in the layers the config's MoE spec makes sparse."""

    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__(config, index)
        spec = MoeSpec.from_config(config)
        self.moe = SparseMoe(spec, config.hidden_size) if index in spec.sparse_layers else None
        if self.moe is not None:  # no dense gate_up/down to ask the checkpoint for
            self.gate_up = self.down = None

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        return super().mlp(x) if self.moe is None else self.moe.forward(x)
