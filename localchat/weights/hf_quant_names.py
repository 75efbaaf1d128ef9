"""Which Hugging Face quantized linears hf_quant.py hands over compact, by checkpoint name (issue #34)."""

from __future__ import annotations

import re

# The linears handed over compact: a decoder layer's own projections, which every family's load maps by
# name: attention, DeepSeek's MLA low-rank pair (q_a/q_b, kv_a/kv_b; arch/deepseek.py moves their rope
# rows with `reorder_rows`, which keeps the compact form), the MLP, and each routed expert's own (Qwen3-MoE
# and DeepSeek's gate/up/down, Mixtral's w1/w3/w2; LFM2's MLP too), which the torch loader runs like any
# linear (models/moe.py); a compact weight the loader does not run through `linear` is dequantized there.
# Other fused checkpoint matrices, which families may split or restack, stay dequantized.
COMPACT_LINEARS = (
    *("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    *("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj"),
    *(".w1", ".w2", ".w3"),
    # Qwen3.5's gated DeltaNet (its FP8 repos quantize qkv, z and out; b and a where a writer did) and
    # Qwen3-Next's grouped qkvz / ba, which arch/qwen3_next.py splits into those rows (`take_rows`)
    *("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "in_proj_qkvz", "in_proj_ba"),
    "linear_attn.out_proj",
)
_EXPERT = re.compile(r"\.experts\.\d+\.")  # a routed expert's own linear (not a stacked tensor)


def compactable(module: str) -> bool:
    """Whether the linear `module` (checkpoint name, no `.weight`) may be handed over compact."""
    expert_ok = ".experts." not in module or _EXPERT.search(module) is not None
    return ".layers." in module and expert_ok and module.endswith(COMPACT_LINEARS)
