"""DeepSeek-V2 / V3 and Mistral 4 (multi-head latent attention) under tensor parallelism: cut by head.

What each rank computes: q for its heads (q_proj's rows, or with a low-rank q the replicated q_a_proj
and its norm, then q_b_proj's rows of its heads), the whole latent and shared rope key (kv_a_proj_with_mqa
and its norm are replicated: they are the same for every head, and cutting them would need a
collective before kv_b), kv_b_proj's rows of its heads (their nope keys and values), and o_proj's
columns of its heads' values (row-parallel: one all-reduce). The paged cache stores each head's
expanded key and value (arch/deepseek.py), so a rank's pool holds its heads' only: 1/N of the cache,
and no latent is cached on any rank (no replicated latent to count in memory.py). The replicated
q_a / kv_a matmuls are the price: (q_lora_rank + kv_lora_rank + rope) x hidden per token on every
rank, about 6% of a DeepSeek-V3 layer's attention weights.

The MoE is cut as Qwen3-MoE's (shard_weights.py): routed and shared experts along their width, the
router (V2's softmax, V3's sigmoid with its choice bias and group-limited top-k) replicated, so every
rank picks the same experts; the block's output is one all-reduce, as the first layers' dense MLP's.
"""

from __future__ import annotations

from dataclasses import replace

from localchat.backends.torch.models.deepseek import DeepseekLayer
from localchat.weights.config import ModelConfig
from localchat.weights.hf_q8_blocks import Q8Linear
from localchat.weights.tensors import WeightTensor

from .shard_llama import AllReduced
from .shard_q8 import q8_rows

MLA_FAMILIES = ("deepseek", "mistral4")
# Parameters whose rows are grouped by head: q_proj / q_b_proj (nope | rope per head), kv_b_proj
# (nope key | value per head).
HEAD_ROWS = frozenset({"q", "kv_b"})
# llama.cpp's split kv_b (attn_k_b [heads, rank, nope], attn_v_b [heads, v, rank]): the rank's heads
# are cut here and merged into its kv_b by the family's sanitize, which runs at load on the rank's config.
SPLIT_KV_B = ("self_attn.k_b_proj.weight", "self_attn.v_b_proj.weight")


def head_rows(w: WeightTensor, config: ModelConfig, rank: int, world: int) -> WeightTensor:
    """The rank's heads of a head-major tensor: its share of the leading axis (q's and kv_b's rows; the
    heads of a 3-D attn_k_b / attn_v_b, whose quantized data is [heads * rows, bytes]). Whole rows,
    so a GGUF's blocks stay blocks."""
    heads = config.num_attention_heads
    data_rows, shape_rows = w.data.shape[0] // heads, w.shape[0] // heads
    mine = heads // world
    if isinstance(w, Q8Linear):  # an FP8 checkpoint's q_b / kv_b: its codes with their scales
        return q8_rows(w, [(rank * mine * data_rows, mine * data_rows)])
    data = w.data[rank * mine * data_rows : (rank + 1) * mine * data_rows]
    return replace(w, shape=(mine * shape_rows, *w.shape[1:]), data=data)


def value_columns(config: ModelConfig, rank: int, world: int) -> tuple[int, int]:
    """o_proj's input columns of the rank's heads' values: (start, count)."""
    width = config.num_attention_heads // world * int(config.extra["v_head_dim"])
    return rank * width, width


class ParallelDeepseekLayer(AllReduced, DeepseekLayer):
    """DeepseekLayer over this rank's heads and expert columns: o's and the MLP / MoE block's sums."""
