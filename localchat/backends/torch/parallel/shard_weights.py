"""One rank's slice of a Llama-family checkpoint, cut from the weight stream before anything is loaded.

Each `WeightTensor` is sliced as it arrives, so a rank converts (and puts on its device) only its part:
GGUF blocks stay blocks. Column-parallel weights (q/k/v, gate/up, the vocab rows of the embedding and
LM head) keep whole rows, and a quantized row is a run of whole blocks, so their slice is a row range
of the file's bytes. Row-parallel weights (o, down) are cut along the input dim: when the cut falls
on block boundaries the slice is a byte range of every row (still blocks); otherwise that tensor is
dequantized a few rows at a time and only this rank's columns are kept (never the whole float tensor).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import cast

import numpy as np

from localchat.arch.moe import MoeSpec
from localchat.arch.registry import architecture
from localchat.weights.config import ModelConfig
from localchat.weights.experts import split_experts
from localchat.weights.hf_q8_blocks import Q8Linear
from localchat.weights.hf_quant_blocks import RepackedLinear
from localchat.weights.ordered_blocks import OrderedBlocks
from localchat.weights.tensors import WeightTensor

from .group import ParallelGroup
from .shard_int4 import act_order_mlp, exact, int4_columns, int4_rows, is_int4
from .shard_mla import HEAD_ROWS, MLA_FAMILIES, SPLIT_KV_B, head_rows, value_columns
from .shard_moe import OWN_WIDTHS, dense_width, family_width, turn_stacked_experts
from .shard_ordered import ordered_columns_part
from .shard_q8 import q8_columns, q8_rows

# Families whose `sanitize` is run before the cut (and again, a no-op, at load): LFM2's conv taps
# reshaped, Granite 4.0-H's stacked experts renamed so split_experts finds them.
# Qwen3-Next: qkvz / ba split apart; gpt-oss: its stacked (and MXFP4) experts split per expert, gate
# rows then up rows.
SANITIZED_BEFORE_CUT = ("lfm2", "mamba_hybrid", "qwen3_next", "gpt_oss")
DEQUANT_ROWS = 256  # rows dequantized at a time when a row-parallel cut splits GGUF blocks
LAYER_NAME = re.compile(r"model\.layers\.(\d+)\.(.+)")


def expert_size(config: ModelConfig) -> int:
    """Each expert's intermediate width (MoE models; the MLP width otherwise), as moe.py reads it."""
    return int(config.extra.get("moe_intermediate_size") or config.intermediate_size)


@dataclass(frozen=True, slots=True)
class RankSlice:
    """Which rows/columns of each weight rank `rank` keeps (see shard.py for the layout)."""

    rank: int
    world: int
    heads: int  # q heads on this rank
    kv_heads: int  # KV heads on this rank (replicated when the model has fewer than ranks)
    kv_first: int  # the first KV head it keeps
    mlp_size: int  # the dense MLP's full width
    expert_size: int  # each expert's full width (MoE)
    vocab_start: int
    vocab_rows: int  # real vocab rows (the last rank's may be fewer than `vocab_padded`)
    vocab_padded: int

    @staticmethod
    def of(config: ModelConfig, group: ParallelGroup) -> RankSlice:
        rank, world = group.rank, group.world_size
        kvh = config.num_key_value_heads
        local_kv = max(kvh // world, 1)
        # Replicated KV heads (kvh < world): rank r's q heads all read KV head r // (world // kvh).
        kv_first = rank * local_kv if kvh >= world else rank // (world // kvh)
        padded = -(-config.vocab_size // world)
        start = rank * padded
        return RankSlice(
            rank,
            world,
            config.num_attention_heads // world,
            local_kv,
            kv_first,
            config.intermediate_size,
            expert_size(config),
            start,
            max(0, min(config.vocab_size - start, padded)),
            padded,
        )

    def local_config(self, config: ModelConfig) -> ModelConfig:
        """The config a rank's model is built from: its heads, MLP width and (padded) vocab slice."""
        extra = dict(config.extra)
        if "moe_intermediate_size" in extra:
            extra["moe_intermediate_size"] = self.expert_size // self.world
        if extra.get("shared_expert_intermediate_size"):  # Qwen3-Next / Qwen3.5-MoE: cut like the experts
            extra["shared_expert_intermediate_size"] = (
                int(extra["shared_expert_intermediate_size"]) // self.world
            )
        if "conv_L_cache" in extra:  # LFM2's short-conv layers: the rank's channels
            extra["conv_channels"] = config.hidden_size // self.world
        if config.model_type == "nemotron_h":  # re-derived into `ssm`: the rank's heads and groups
            extra["mamba_num_heads"] = int(extra["ssm"]["heads"]) // self.world
            extra["n_groups"] = int(extra["ssm"]["groups"]) // self.world
        if config.model_type == "granitemoehybrid":  # the same, and its head size no longer "auto"
            extra["mamba_n_heads"] = int(extra["ssm"]["heads"]) // self.world
            extra["mamba_n_groups"] = int(extra["ssm"]["groups"]) // self.world
            extra["mamba_d_head"] = int(extra["ssm"]["head_dim"])
            extra["shared_intermediate_size"] = int(extra["shared_intermediate_size"]) // self.world
        if "linear_num_key_heads" in extra:  # Qwen3.5 / Qwen3-Next's DeltaNet: the rank's heads
            extra["linear_num_key_heads"] = int(extra["linear_num_key_heads"]) // self.world
            extra["linear_num_value_heads"] = int(extra["linear_num_value_heads"]) // self.world
        if extra.get("intermediate_size_mlp"):  # Llama 4's dense layers: their own width
            extra["intermediate_size_mlp"] = dense_width(config) // self.world
        if extra.get("gguf_ssm_inner_size"):  # a Mamba-2 / DeltaNet GGUF, sanitized before the cut
            # The rank's tensors are in the checkpoint's form, so its config drops the keys that say
            # "llama.cpp's form" (sanitize would convert them again: A_log = log(-A) twice) and whose
            # whole-model inner size would re-derive a doubled head width; the sizes derived from them
            # (head widths, layer kinds) are kept.
            extra["gguf_ssm_inner_size"], extra["gguf_kv_heads"] = 0, None
        if "block_ff_dim" in extra:  # LFM2 re-derives its MLP width from this one: make it the rank's
            extra["block_ff_dim"], extra["block_auto_adjust_ff_dim"] = self.mlp_size // self.world, False
        return replace(
            config,
            num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads,
            intermediate_size=self.mlp_size // self.world,
            vocab_size=self.vocab_padded,
            extra=extra,
        )


def shard_weights(
    weights: Iterable[WeightTensor], config: ModelConfig, part: RankSlice
) -> Iterator[WeightTensor]:
    """The rank's slice of every weight, classified by the parameter the registry maps it to (so
    Mixtral's and Qwen3-MoE's experts are cut like the dense MLP, along their intermediate dim)."""
    arch = architecture(config.model_type)
    d = config.head_dim
    q = (part.rank * part.heads * d, part.heads * d)
    kv = (part.kv_first * d, part.kv_heads * d)
    if arch.sanitize is not None and arch.family in SANITIZED_BEFORE_CUT:
        weights = arch.sanitize(config, weights)
    if arch.family == "llama4":
        weights = turn_stacked_experts(config, weights)
    shared = int(config.extra.get("shared_intermediate_size") or 0)  # Granite 4.0-H's shared MLP
    mla = arch.family in MLA_FAMILIES  # DeepSeek / Mistral 4: cut by head (shard_mla.py)
    # stacked experts -> one weight each (load_model's split: a no-op then); an act-order int4 down's MLP
    # permuted into its stored order (shard_int4.py), so each rank's cut of down is whole blocks
    for w in act_order_mlp(split_experts(weights), arch):
        name = w.name
        # Nemotron-H's embedding is `model.embeddings.weight` (the family's top_weights name it)
        if name in ("model.embed_tokens.weight", "lm_head.weight") or arch.top_weights.get(name) == "embed":
            # hf_quant's int4 linears keep their blocks (shard_int4.py) but here and in MLA's head cuts
            yield _vocab_rows(exact(w), part)
            continue
        if mla and name.endswith(SPLIT_KV_B):  # merged into kv_b after the cut, at load
            yield head_rows(exact(w), config, part.rank, part.world)
            continue
        match = LAYER_NAME.fullmatch(name)
        found = arch.layer_weight(match.group(2)) if match else None
        if found is None:
            yield w  # the final norm, buffers: replicated (load_model judges unknown names)
            continue
        pname, index, parts = found
        leaf = pname.rpartition(".")[2]
        if pname.startswith("mamba."):
            yield _mamba_part(w, leaf, config, part)
            continue
        if mla and leaf in HEAD_ROWS:
            yield head_rows(exact(w), config, part.rank, part.world)
            continue
        if mla and leaf == "o":
            yield columns(w, *value_columns(config, part.rank, part.world))
            continue
        if arch.family == "qwen3_next" and leaf in DELTANET_LEAVES:
            yield _deltanet_part(w, leaf, index, config, part)
            continue
        if arch.family == "qwen3_next" and leaf == "qkv" and index == 0:  # q and its gate, per head
            yield rows(w, part.rank * part.heads * 2 * d, part.heads * 2 * d)
            continue
        if arch.family in OWN_WIDTHS:  # GLM-4.5, Llama 4: shard_moe.py
            width = family_width(config, pname, part.expert_size)
        elif pname.startswith("moe.shared."):  # Qwen3-Next / Qwen3.5-MoE's shared expert: its own width
            # (DeepSeek's: n_shared_experts experts' width)
            width = int(config.extra.get("shared_expert_intermediate_size") or 0)
            width = width or MoeSpec.from_config(config).shared_size
        else:
            width = part.expert_size if pname.startswith("moe.") else shared or part.mlp_size
        mlp = (part.rank * width // part.world, width // part.world)
        hidden = config.hidden_size  # LFM2's short conv: channels cut like an MLP's columns
        channels = (part.rank * hidden // part.world, hidden // part.world)
        if leaf in ("qkv", "qkv_bias") and parts == 1:  # Phi-3's fused q|k|v: the rank's rows of each
            yield _fused_qkv_rows(w, config, q, kv)
        elif leaf in ("qkv", "qkv_bias"):
            yield rows(w, *(q if index == 0 else kv))
        elif leaf == "up":  # Nemotron-H's relu² MLP
            yield rows(w, *mlp)
        elif leaf in ("gate_up", "gate_up_bias"):  # gpt-oss's expert bias: cut with its rows
            yield rows(w, *mlp) if parts == 2 else _gate_up_rows(w, width, *mlp)
        elif leaf == "sinks":  # gpt-oss: one per q head
            yield rows(w, part.rank * part.heads, part.heads)
        elif leaf == "o":
            yield columns(w, *q)
        elif leaf == "down":
            yield columns(w, *mlp)
        elif leaf in ("in_proj", "in_proj_bias"):  # B | C | x, each hidden wide: the rank's channels of each
            yield _part_rows(w, hidden, 3, *channels)
        elif leaf in ("conv", "conv_bias"):  # depthwise: one row per channel
            yield rows(w, *channels)
        elif leaf == "out":
            yield columns(w, *channels)
        elif leaf in ("o_bias", "down_bias", "out_bias"):
            # Added after the all-reduce's sum: on rank 0 only, zeros elsewhere.
            yield w if part.rank == 0 else replace(w, data=np.zeros_like(w.data))
        else:
            yield w  # norms, the router: replicated


DELTANET_LEAVES = frozenset({"in_proj", "conv", "dt_bias", "A_log", "out"})


def _deltanet_part(
    w: WeightTensor, leaf: str, index: int, config: ModelConfig, part: RankSlice
) -> WeightTensor:
    """A DeltaNet weight cut to the rank's key heads and their value heads (grouped by key head):
    in_proj_qkv's and the conv's q | k | v rows (index 0), z's rows (1), b's and a's (2, 3)."""
    x, r, world = config.extra, part.rank, part.world
    nk, nv, dk, dv = (
        int(x[k])
        for k in (
            "linear_num_key_heads",
            "linear_num_value_heads",
            "linear_key_head_dim",
            "linear_value_head_dim",
        )
    )
    keys, values = (r * nk * dk // world, nk * dk // world), (r * nv * dv // world, nv * dv // world)
    heads = (r * nv // world, nv // world)
    if leaf == "out":
        return ordered_columns_part(w, *values) if isinstance(w, OrderedBlocks) else columns(w, *values)
    if leaf in ("dt_bias", "A_log") or (leaf == "in_proj" and index in (2, 3)):
        return rows(w, *heads)
    if leaf == "in_proj" and index == 1:
        return rows(w, *values)
    blocks = [(0, keys), (nk * dk, keys), (2 * nk * dk, values)]  # in_proj_qkv, the conv: q | k | v
    return row_ranges(w, [(base + start, count) for base, (start, count) in blocks])


def _mamba_part(w: WeightTensor, leaf: str, config: ModelConfig, part: RankSlice) -> WeightTensor:
    """A Mamba-2 mixer's weight cut to the rank's heads and the SSM groups they read (contiguous: head
    i reads group i // (heads / groups)). in_proj's rows are z | x | B | C | dt, the conv's x | B | C."""
    s = config.extra["ssm"]
    r, world = part.rank, part.world
    inner, heads, group_width = s["heads"] * s["head_dim"], s["heads"] // world, s["groups"] * s["d_state"]
    mine_inner = (r * inner // world, inner // world)
    mine_groups = (r * group_width // world, group_width // world)
    mine_heads = (r * heads, heads)
    if leaf == "out_bias":  # added after the all-reduce's sum: on rank 0 only
        return w if r == 0 else replace(w, data=np.zeros_like(w.data))
    if leaf == "out":
        return columns(w, *mine_inner)
    starts: dict[str, list[tuple[int, tuple[int, int]]]] = {
        "in_proj": [(0, mine_inner), (inner, mine_inner), (2 * inner, mine_groups)],
        "conv": [(0, mine_inner), (inner, mine_groups), (inner + group_width, mine_groups)],
        "gated_norm": [(0, mine_inner)],
    }
    starts["in_proj"] += [(2 * inner + group_width, mine_groups), (2 * inner + 2 * group_width, mine_heads)]
    blocks = starts.get(leaf.removesuffix("_bias")) or [(0, mine_heads)]  # dt_bias, A_log, D: per head
    return row_ranges(w, [(base + start, count) for base, (start, count) in blocks])


def _fused_qkv_rows(
    w: WeightTensor, config: ModelConfig, q: tuple[int, int], kv: tuple[int, int]
) -> WeightTensor:
    """A fused [q; k; v] matrix (or bias): the rank's q rows, then its KV heads' k and v rows. Whole
    rows, so a GGUF's quantized blocks stay blocks."""
    q_rows, kv_rows = (
        config.num_attention_heads * config.head_dim,
        config.num_key_value_heads * config.head_dim,
    )
    blocks = [(0, q), (q_rows, kv), (q_rows + kv_rows, kv)]
    return row_ranges(w, [(base + start, count) for base, (start, count) in blocks])


def _gate_up_rows(w: WeightTensor, width: int, start: int, count: int) -> WeightTensor:
    """A fused [gate; up] matrix: the rank's rows of each half."""
    return _part_rows(w, width, 2, start, count)


def _part_rows(w: WeightTensor, width: int, parts: int, start: int, count: int) -> WeightTensor:
    """A matrix (or vector) of `parts` stacked blocks `width` rows each: the rank's rows of every block."""
    return row_ranges(w, [(p * width + start, count) for p in range(parts)])


def row_ranges(w: WeightTensor, ranges: list[tuple[int, int]]) -> WeightTensor:
    """Rows [start, start + count) of each range, in order (an FP8 linear's with their scales)."""
    if isinstance(w, Q8Linear):
        return q8_rows(w, ranges)
    if is_int4(w):
        return int4_rows(cast(RepackedLinear, w), ranges)
    data = np.concatenate([w.data[start : start + count] for start, count in ranges])
    return replace(w, shape=(data.shape[0], *w.shape[1:]), data=data)


def rows(w: WeightTensor, start: int, count: int) -> WeightTensor:
    """Rows [start, start + count): whole rows of blocks for a quantized matrix, a vector's range."""
    if isinstance(w, Q8Linear):
        return q8_rows(w, [(start, count)])
    if is_int4(w):
        return int4_rows(cast(RepackedLinear, w), [(start, count)])
    return replace(w, shape=(count, *w.shape[1:]), data=w.data[start : start + count])


def _vocab_rows(w: WeightTensor, part: RankSlice) -> WeightTensor:
    mine = w.data[part.vocab_start : part.vocab_start + part.vocab_rows]
    if part.vocab_rows < part.vocab_padded:
        # Zero padding so every rank's logits part is the same size; zero bytes are zero weights in
        # every GGUF block type too (scale 0).
        pad = np.zeros((part.vocab_padded - part.vocab_rows, *mine.shape[1:]), dtype=mine.dtype)
        mine = np.concatenate((mine, pad))
    return replace(w, shape=(part.vocab_padded, *w.shape[1:]), data=mine)


def columns(w: WeightTensor, start: int, count: int) -> WeightTensor:
    """Input columns [start, start + count) of every row."""
    shape = (w.shape[0], count)
    if isinstance(w, Q8Linear):
        return q8_columns(w, start, count)
    if is_int4(w):
        return int4_columns(cast(RepackedLinear, w), start, count)
    if not w.is_quantized:
        return replace(w, shape=shape, data=w.data[:, start : start + count])
    block, block_bytes = _block_geometry(w.dtype)
    if start % block == 0 and count % block == 0:
        first, size = start // block * block_bytes, count // block * block_bytes
        return replace(w, shape=shape, data=w.data[:, first : first + size])
    # The cut splits blocks: dequantize a few rows at a time, keep this rank's float32 columns.
    chunks = [
        replace(w, shape=(len(rows), w.shape[1]), data=rows).dequantize()[:, start : start + count]
        for rows in (w.data[i : i + DEQUANT_ROWS] for i in range(0, w.shape[0], DEQUANT_ROWS))
    ]
    return WeightTensor(w.name, shape, "F32", np.concatenate(chunks))


def _block_geometry(qtype: str) -> tuple[int, int]:
    """(values per block, bytes per block) of a GGUF block type."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    values, size = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]]
    return int(values), int(size)
