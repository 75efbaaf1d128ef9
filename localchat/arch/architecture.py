"""The registry's entry type (`Architecture`) and the checkpoint/GGUF name tables several entries share
(Llama's layer names, DeepSeek's, the MoE expert layouts). The entries themselves are in registry.py and
families.py, which both import this module."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from localchat.weights.config import ModelConfig
    from localchat.weights.tensors import WeightTensor

# A checkpoint name inside `model.layers.N.` -> (the family's parameter, part index, number of parts).
# Parts are fused in index order at load time (q|k|v, gate|up); backends may fuse differently.
WeightMap = dict[str, tuple[str, int, int]]

LLAMA_LAYER_WEIGHTS: WeightMap = {
    "input_layernorm.weight": ("attn_norm", 0, 1),
    "self_attn.q_proj.weight": ("qkv", 0, 3),
    "self_attn.k_proj.weight": ("qkv", 1, 3),
    "self_attn.v_proj.weight": ("qkv", 2, 3),
    "self_attn.q_proj.bias": ("qkv_bias", 0, 3),
    "self_attn.k_proj.bias": ("qkv_bias", 1, 3),
    "self_attn.v_proj.bias": ("qkv_bias", 2, 3),
    "self_attn.o_proj.weight": ("o", 0, 1),
    "self_attn.o_proj.bias": ("o_bias", 0, 1),
    "post_attention_layernorm.weight": ("mlp_norm", 0, 1),
    "mlp.gate_proj.weight": ("gate_up", 0, 2),
    "mlp.up_proj.weight": ("gate_up", 1, 2),
    "mlp.down_proj.weight": ("down", 0, 1),
}
QK_NORM_WEIGHTS: WeightMap = {
    "self_attn.q_norm.weight": ("q_norm", 0, 1),
    "self_attn.k_norm.weight": ("k_norm", 0, 1),
}
# Gemma 2/3: norms around both attention and MLP (their q_norm/k_norm as in QK_NORM_WEIGHTS).
GEMMA_LAYER_WEIGHTS: WeightMap = {
    **{k: v for k, v in LLAMA_LAYER_WEIGHTS.items() if not k.endswith("bias")},
    "post_attention_layernorm.weight": ("post_attn_norm", 0, 1),
    "pre_feedforward_layernorm.weight": ("mlp_norm", 0, 1),
    "post_feedforward_layernorm.weight": ("post_mlp_norm", 0, 1),
}
# Phi-3 stores q|k|v and gate|up already fused, in the order the families fuse them: one part each.
PHI3_LAYER_WEIGHTS: WeightMap = {
    "input_layernorm.weight": ("attn_norm", 0, 1),
    "self_attn.qkv_proj.weight": ("qkv", 0, 1),
    "self_attn.o_proj.weight": ("o", 0, 1),
    "post_attention_layernorm.weight": ("mlp_norm", 0, 1),
    "mlp.gate_up_proj.weight": ("gate_up", 0, 1),
    "mlp.down_proj.weight": ("down", 0, 1),
}
# llama.cpp's phi3 blocks: q|k|v fused in `attn_qkv`, gate|up in `ffn_up`, as in the HF checkpoint.
PHI3_GGUF_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_qkv": "self_attn.qkv_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_up": "mlp.gate_up_proj",
    "ffn_down": "mlp.down_proj",
}
# Mixture-of-experts layers: `{e}` stands for the expert index, in checkpoint names and parameters alike.
# Parameters are paths into the layer (`moe.experts.3.gate_up`); 3-D stacked expert tensors (transformers 5,
# GGUF `*_exps`) are split into per-expert ones first (localchat/weights/experts.py).
_STACKED_EXPERT_WEIGHTS: WeightMap = {
    "mlp.gate.weight": ("moe.router", 0, 1),
    "mlp.experts.{e}.gate_up_proj": ("moe.experts.{e}.gate_up", 0, 1),
    "mlp.experts.{e}.down_proj": ("moe.experts.{e}.down", 0, 1),
}
QWEN3_MOE_WEIGHTS: WeightMap = {
    **_STACKED_EXPERT_WEIGHTS,
    "mlp.experts.{e}.gate_proj.weight": ("moe.experts.{e}.gate_up", 0, 2),
    "mlp.experts.{e}.up_proj.weight": ("moe.experts.{e}.gate_up", 1, 2),
    "mlp.experts.{e}.down_proj.weight": ("moe.experts.{e}.down", 0, 1),
}
MIXTRAL_WEIGHTS: WeightMap = {  # the hub's names (and save_pretrained's) next to transformers 5's in memory
    **_STACKED_EXPERT_WEIGHTS,
    "block_sparse_moe.gate.weight": ("moe.router", 0, 1),
    "block_sparse_moe.experts.{e}.w1.weight": ("moe.experts.{e}.gate_up", 0, 2),
    "block_sparse_moe.experts.{e}.w3.weight": ("moe.experts.{e}.gate_up", 1, 2),
    "block_sparse_moe.experts.{e}.w2.weight": ("moe.experts.{e}.down", 0, 1),
}
# Config keys MoE model files read (localchat/arch/moe.py); transformers 5 writes Qwen3-MoE's
# `num_experts` as `num_local_experts`, so both are read.
MOE_EXTRA_KEYS: dict[str, Any] = {
    "num_experts": 0,
    "num_local_experts": 0,
    "num_experts_per_tok": 2,
    "norm_topk_prob": True,  # llama.cpp always renormalises (and Mixtral's softmax over the top k equals it)
    "moe_intermediate_size": None,  # None: intermediate_size
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
}
_EXPERT_INDEX = re.compile(r"\.experts\.(\d+)\.")
# Outside the layers: checkpoint name -> parameter.
TOP_WEIGHTS = {"model.embed_tokens.weight": "embed", "model.norm.weight": "norm", "lm_head.weight": "lm_head"}

# llama.cpp block tensor part -> the Hugging Face name inside `model.layers.N.` (Llama's layout).
LLAMA_GGUF_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# llama.cpp's MoE tensors: the router and the experts stacked [experts, out, in].
QWEN3_MOE_GGUF_BLOCK_NAMES = {
    **LLAMA_GGUF_BLOCK_NAMES,
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.gate_proj",
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
}
MIXTRAL_GGUF_BLOCK_NAMES = {
    **LLAMA_GGUF_BLOCK_NAMES,
    "ffn_gate_inp": "block_sparse_moe.gate",
    "ffn_gate_exps": "block_sparse_moe.experts.w1",
    "ffn_up_exps": "block_sparse_moe.experts.w3",
    "ffn_down_exps": "block_sparse_moe.experts.w2",
}

# Gemma 2/3 in llama.cpp: "ffn_norm" is the norm before the MLP, two more follow attention and MLP.
GEMMA_GGUF_BLOCK_NAMES = {
    **LLAMA_GGUF_BLOCK_NAMES,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}

# DeepSeek-V2/V3: multi-head latent attention (q_proj, or q_a -> norm -> q_b), a shared-expert MoE after
# `first_k_dense_replace` dense layers, V3's router bias (localchat/arch/deepseek.py).
DEEPSEEK_WEIGHTS: WeightMap = {
    **{k: v for k, v in LLAMA_LAYER_WEIGHTS.items() if not k.startswith("self_attn.")},
    **QWEN3_MOE_WEIGHTS,
    "self_attn.q_proj.weight": ("q", 0, 1),
    "self_attn.q_a_proj.weight": ("q_a", 0, 1),
    "self_attn.q_a_proj.bias": ("q_a_bias", 0, 1),
    "self_attn.q_a_layernorm.weight": ("q_a_norm", 0, 1),
    "self_attn.q_b_proj.weight": ("q", 0, 1),  # the low-rank q's second half: the same role as q_proj
    "self_attn.kv_a_proj_with_mqa.weight": ("kv_a", 0, 1),
    "self_attn.kv_a_proj_with_mqa.bias": ("kv_a_bias", 0, 1),
    "self_attn.kv_a_layernorm.weight": ("kv_a_norm", 0, 1),
    "self_attn.kv_b_proj.weight": ("kv_b", 0, 1),
    "self_attn.o_proj.weight": ("o", 0, 1),
    "self_attn.o_proj.bias": ("o_bias", 0, 1),
    "mlp.gate.e_score_correction_bias": ("moe.score_bias", 0, 1),
    "mlp.gate.e_score_correction.bias": ("moe.score_bias", 0, 1),  # its name from a GGUF's exp_probs_b.bias
    "mlp.shared_experts.gate_proj.weight": ("moe.shared.gate_up", 0, 2),
    "mlp.shared_experts.up_proj.weight": ("moe.shared.gate_up", 1, 2),
    "mlp.shared_experts.down_proj.weight": ("moe.shared.down", 0, 1),
}
DEEPSEEK_FLOAT32 = frozenset({"router", "score_bias"})
# Config keys the DeepSeek model files read, with transformers' DeepseekV2Config defaults.
DEEPSEEK_EXTRA_KEYS: dict[str, Any] = {
    "q_lora_rank": None,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "rope_interleave": True,  # V2 and llama.cpp files always pair the rotary dims
    "n_routed_experts": 0,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": None,
    "n_shared_experts": 0,
    "first_k_dense_replace": 0,
    "norm_topk_prob": False,
    "routed_scaling_factor": 1.0,
    "scoring_func": "softmax",
    "expert_gating_func": None,  # GGUF: 1 softmax, 2 sigmoid
    "topk_method": None,  # "greedy": no group limit even with n_group > 1 (V2-Lite)
    "n_group": 1,
    "topk_group": 1,
}
# llama.cpp's deepseek2 blocks. Newer files split kv_b into attn_k_b / attn_v_b (sanitize merges them).
DEEPSEEK_GGUF_BLOCK_NAMES = {
    **QWEN3_MOE_GGUF_BLOCK_NAMES,
    "attn_q_a": "self_attn.q_a_proj",
    "attn_q_a_norm": "self_attn.q_a_layernorm",
    "attn_q_b": "self_attn.q_b_proj",
    "attn_kv_a_mqa": "self_attn.kv_a_proj_with_mqa",
    "attn_kv_a_norm": "self_attn.kv_a_layernorm",
    "attn_kv_b": "self_attn.kv_b_proj",
    "attn_k_b": "self_attn.k_b_proj",
    "attn_v_b": "self_attn.v_b_proj",
    "ffn_gate_shexp": "mlp.shared_experts.gate_proj",
    "ffn_up_shexp": "mlp.shared_experts.up_proj",
    "ffn_down_shexp": "mlp.shared_experts.down_proj",
    "exp_probs_b": "mlp.gate.e_score_correction",  # the file's tensor is exp_probs_b.bias
}
DEEPSEEK_GGUF_METADATA = {
    "attention.q_lora_rank": "q_lora_rank",
    "attention.kv_lora_rank": "kv_lora_rank",
    "rope.dimension_count": "qk_rope_head_dim",
    # Head sizes: llama.cpp's MLA files give the latent in key/value_length and the heads in *_mla;
    # older files the heads in key/value_length (deepseek.derive_sizes reads them).
    "attention.key_length": "gguf_key_length",
    "attention.value_length": "gguf_value_length",
    "attention.key_length_mla": "gguf_key_length_mla",
    "attention.value_length_mla": "gguf_value_length_mla",
    "leading_dense_block_count": "first_k_dense_replace",
    "expert_count": "n_routed_experts",
    "expert_used_count": "num_experts_per_tok",
    "expert_feed_forward_length": "moe_intermediate_size",
    "expert_shared_count": "n_shared_experts",
    "expert_weights_scale": "routed_scaling_factor",
    "expert_weights_norm": "norm_topk_prob",
    "expert_gating_func": "expert_gating_func",
    "expert_group_count": "n_group",
    "expert_group_used_count": "topk_group",
}


@dataclass(frozen=True, slots=True)
class Architecture:
    model_type: str  # Hugging Face `model_type`
    family: str  # backend model module that computes it
    layer_weights: WeightMap = field(default_factory=lambda: dict(LLAMA_LAYER_WEIGHTS))
    # config.json defaults that differ from Llama's, applied where the key is absent.
    hf_defaults: dict[str, Any] = field(default_factory=dict)
    # Architecture-specific config keys the model file reads (from `ModelConfig.extra`), with defaults.
    extra_keys: dict[str, Any] = field(default_factory=dict)
    # llama.cpp's `general.architecture` for it (None: no GGUF form we load).
    gguf_arch: str | None = None
    gguf_block_names: dict[str, str] = field(default_factory=lambda: dict(LLAMA_GGUF_BLOCK_NAMES))
    # `{arch}.<key>` GGUF metadata -> the config.json key it sets (beyond the common sizes).
    gguf_metadata: dict[str, str] = field(default_factory=dict)
    # llama.cpp interleaves q/k rows for its rope kernel in the archs it converts with Llama's script.
    gguf_permuted_qk: bool = False
    # llama.cpp's converter stores some norm weights shifted (Gemma: 1 + weight); loading subtracts it.
    gguf_norm_offset: float = 0.0
    # GGUF records no query_pre_attn_scalar. llama.cpp scales Gemma's scores by head_dim ** -0.5, except
    # in the 27B (known by its block count), by (hidden / heads) ** -0.5, as its checkpoint does.
    gguf_wide_query_scale_layers: int | None = None
    # A multimodal wrapper whose text LM we run alone: the key its config nests under, and checkpoint
    # name prefixes -> the text model's (None: a part we do not run, e.g. the vision tower; skipped).
    text_config_key: str | None = None
    weight_prefixes: dict[str, str | None] = field(default_factory=dict)
    # Per-expert tensors of older llama.cpp files (`blk.N.ffn_gate.E.weight`): part -> HF name with `{e}`.
    gguf_expert_names: dict[str, str] = field(default_factory=dict)
    # The model type a file of this `gguf_arch` is when its `{arch}.expert_count` is above 0 (llama.cpp
    # writes Mixtral as "llama" with experts).
    gguf_experts_model_type: str | None = None
    # Sets sizes that follow from others once a config is built (DeepSeek: cache heads and width).
    derive_sizes: Callable[[ModelConfig], None] | None = None
    # Rewrites the checkpoint's tensors into the layout the family reads, before a backend loads them.
    sanitize: Callable[[ModelConfig, Iterable[WeightTensor]], Iterable[WeightTensor]] | None = None
    # Parameters loaded in float32 whatever the compute dtype (DeepSeek's router and its bias: bf16 would
    # reorder near-tied experts; transformers and llama.cpp keep them float32 too).
    float32_params: frozenset[str] = frozenset()
    # llama.cpp's `rope.scaling.yarn_log_multiplier` is this times transformers' mscale_all_dim.
    gguf_yarn_log_mul_per_mscale: float = 1.0
    # Checkpoint names outside the layers -> model parameters, beyond TOP_WEIGHTS (Gemma 4's per-layer
    # embedding tables).
    top_weights: dict[str, str] = field(default_factory=dict)
    # Hybrid models: bytes of per-sequence state (config, compute dtype bytes), for the RAM estimate.
    state_bytes: Callable[[ModelConfig, int], int] | None = None
    # Families whose GGUF metadata the common reader cannot express (per-layer arrays, one RoPE table per
    # layer type): config.json's keys from `{arch}.<key>` metadata, tensor shapes (HF order) and the values
    # of a small float tensor (rope_freqs); the loader adds model_type and the token ids.
    gguf_hf_config: (
        Callable[[Callable[[str], Any], dict[str, tuple[int, ...]], Callable[[str], Any]], dict[str, Any]]
        | None
    ) = None

    def layer_weight(self, name: str) -> tuple[str, int, int] | None:
        """The family parameter for a checkpoint name inside `model.layers.N.` (None: not this arch's)."""
        if name in self.layer_weights:
            return self.layer_weights[name]
        match = _EXPERT_INDEX.search(name)
        if match is None:
            return None
        generic = f"{name[: match.start()]}.experts.{{e}}.{name[match.end() :]}"
        if generic not in self.layer_weights:
            return None
        pname, part, parts = self.layer_weights[generic]
        return pname.format(e=match.group(1)), part, parts
