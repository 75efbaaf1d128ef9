"""What the MoE families gpt-oss, GLM-4.5 and Llama 4 add to the cut (shard_weights.py), beside the
Qwen3-MoE slice every MoE shares: experts cut along their intermediate width like a dense MLP (every
rank holds every expert's slice), the router replicated, the block summed by the layer's one
all-reduce after down.

- gpt-oss: each head's attention sink goes with its head; an expert's gate|up bias with its rows, its
  down bias (added after the sum) on rank 0 only, like o's. The clamped SwiGLU pairs gate and up column
  by column, so it runs on a rank's columns unchanged. MXFP4 experts are blocks of 32 along the input:
  gate|up's rows are whole rows (blocks kept); down's input columns stay blocks when a rank's share of
  the width is a multiple of 32, and are otherwise dequantized to float32 for that rank (shard_weights'
  `columns`).
- GLM-4.5: the sigmoid router and its selection bias replicated (every rank picks the same experts), the
  shared expert cut along its n_shared_experts experts' width, the first dense layers like Llama's.
- Llama 4: the router's sigmoid weight scales each expert's input, a per-token scalar from the replicated
  router, so the rank's partial sums still add up; the shared expert is one expert wide, the interleaved
  dense layers `intermediate_size_mlp` wide. Its stacked experts are stored [experts, in, out]: turned
  here before the cut, which reads a matrix's rows as its outputs.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from localchat.arch.registry import architecture
from localchat.weights.config import ModelConfig
from localchat.weights.tensors import WeightTensor

# transformers' Llama 4 expert stacks, [experts, in, out] (llama.cpp's files store them [experts, out, in]).
LLAMA4_STACKED = ("feed_forward.experts.gate_up_proj", "feed_forward.experts.down_proj")


# Families whose MLP weights are cut along the widths `family_width` gives.
OWN_WIDTHS = ("glm4_moe", "llama4")


def family_width(config: ModelConfig, pname: str, expert: int) -> int:
    """The full width GLM-4.5's or Llama 4's MLP weight `pname` is cut along: an expert's (`expert`) for
    the routed experts; n_shared_experts experts' for GLM's shared expert (Llama 4's is one expert
    wide); the dense MLP's for its dense layers."""
    if pname.startswith("moe.shared."):
        return expert * int(config.extra.get("n_shared_experts") or 1)
    return expert if pname.startswith("moe.") else dense_width(config)


def dense_width(config: ModelConfig) -> int:
    """The width of a layer's dense MLP: Llama 4 names its own (its intermediate_size is an expert's)."""
    return int(config.extra.get("intermediate_size_mlp") or config.intermediate_size)


def turn_stacked_experts(config: ModelConfig, weights: Iterable[WeightTensor]) -> Iterator[WeightTensor]:
    """Llama 4's stacked experts turned to [experts, out, in] (its sanitize's step for them) before the
    cut. Its other step, each head's q/k rows reordered, runs at load on the rank's whole heads."""
    sanitize = architecture(config.model_type).sanitize
    for w in weights:
        if sanitize is not None and w.name.endswith(LLAMA4_STACKED):
            yield from sanitize(config, [w])
        else:
            yield w
