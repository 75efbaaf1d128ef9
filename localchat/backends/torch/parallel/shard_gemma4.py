"""Gemma 4 (dense text models, E2B / E4B included) under tensor parallelism: Gemma 2 / 3's layout
(shard_gemma.py: heads and GeGLU columns per rank, the two row-parallel sums before the post norms,
sqrt(hidden) after the vocab-parallel lookup, the soft-cap after the gather) with Gemma 4's per-layer
sizes. Each layer's q, k, v and o are cut at that layer's head size, its K/V heads split (or one kept
whole per rank when a layer has fewer than the ranks, as for the global layers' single K=V head) and its
MLP at its own width (the KV-sharing layers' double-wide one). The q/k norms act per head, the
proportional RoPE per head and the layer scalar on the summed vector, so they are unchanged.

K/V-sharing layers read their source layer's keys and values from this step's `shared` dict and its
cache: every rank holds every layer's head shard, so the source's shard is the one the reader needs.
Per-layer embeddings (E2B / E4B) are replicated: the table, the projection of the (whole, all-reduced)
embedding and each layer's gate and projection act on whole vectors, so every rank computes them
exactly as one device does, at the cost of the table's memory on each rank.
The MoE block (26B-A4B) is cut like Qwen3-MoE's (shard_weights.py): every expert on every rank along its
width, the router, its scales and the block's norms replicated (each rank routes the same whole vector
the same way). Its output and the dense MLP's are normed apart before they are added, so each is
summed first: the layer's forward passes both to `reduce_partial`, two all-reduces where a dense layer
has one."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace

from localchat.arch.registry import architecture
from localchat.backends.torch.models.gemma4 import Gemma4Layer
from localchat.weights.bundle import ModelBundle
from localchat.weights.config import ModelConfig
from localchat.weights.experts import split_experts
from localchat.weights.tensors import WeightTensor

from .shard_llama import AllReduced
from .shard_weights import LAYER_NAME, RankSlice, columns, rows, shard_weights


def _kv_part(kv_heads: int, part: RankSlice) -> tuple[int, int]:
    """(first KV head, count) a rank keeps of a layer with `kv_heads`: its share, or when the layer has
    fewer KV heads than ranks, the one its q heads read (rank r's q heads read head r // (world / kvh))."""
    if kv_heads >= part.world:
        count = kv_heads // part.world
        return part.rank * count, count
    return part.rank // (part.world // kv_heads), 1


def gemma4_bundle(bundle: ModelBundle, part: RankSlice) -> ModelBundle:
    """The rank's bundle: the per-layer KV head counts cut in the config, the weights cut as they stream."""
    config = bundle.config
    local = part.local_config(config)
    extra = dict(local.extra)
    extra["layer_kv_heads"] = [_kv_part(int(k), part)[1] for k in config.extra["layer_kv_heads"]]
    local = replace(local, num_key_value_heads=max(extra["layer_kv_heads"]), extra=extra)
    return replace(
        bundle, config=local, iter_weights=lambda: shard_gemma4_weights(bundle.iter_weights(), config, part)
    )


def shard_gemma4_weights(
    weights: Iterable[WeightTensor], config: ModelConfig, part: RankSlice
) -> Iterator[WeightTensor]:
    """Layer weights cut at their layer's sizes; the rest (vocab rows of the embedding and LM head, the
    replicated per-layer table and projection, the final norm) as shard_weights cuts them."""
    arch = architecture(config.model_type)
    dims, kv_heads = config.extra["layer_head_dims"], config.extra["layer_kv_heads"]
    heads = part.heads
    # The family's sanitize moves the MoE block's stacked experts where split_experts finds them (it runs
    # again at load, a no-op then), so each expert arrives alone and is cut along its width.
    assert arch.sanitize is not None
    for w in split_experts(arch.sanitize(config, weights)):
        match = LAYER_NAME.fullmatch(w.name)
        found = arch.layer_weight(match.group(2)) if match else None
        if match is None or found is None:
            yield from shard_weights([w], config, part)
            continue
        index, leaf = int(match.group(1)), found[0]
        if leaf.startswith("moe."):  # the experts by width; router, scales and norms replicated
            yield from shard_weights([w], config, part)
            continue
        d = int(dims[index])
        kv_first, kv_count = _kv_part(int(kv_heads[index]), part)
        if leaf == "q":
            yield rows(w, part.rank * heads * d, heads * d)
        elif leaf in ("k", "v"):
            yield rows(w, kv_first * d, kv_count * d)
        elif leaf == "o":
            yield columns(w, part.rank * heads * d, heads * d)
        elif leaf == "gate_up":  # gate_proj and up_proj arrive apart: the rank's rows of each
            width = w.shape[0] // part.world
            yield rows(w, part.rank * width, width)
        elif leaf == "down":
            width = w.shape[1] // part.world
            yield columns(w, part.rank * width, width)
        else:
            yield w  # norms, the layer scalar, the per-layer gate and projection: replicated


class ParallelGemma4Layer(AllReduced, Gemma4Layer):
    """Gemma4Layer over this rank's heads and MLP (and expert) columns, the row-parallel sums before the
    norms: o's, the dense MLP's and, in the MoE Gemma 4, the expert block's."""
