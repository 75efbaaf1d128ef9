"""One entry per supported architecture: everything about it that is not backend compute.

An entry names the backend module that computes it (`family`: `localchat/backends/<lib>/models/<family>.py`),
how its Hugging Face config differs from Llama's defaults, which extra config keys its model file reads,
how its checkpoint names map onto the family's parameters, and how llama.cpp writes it in a GGUF file.
Adding an architecture = one entry here + one model file per backend + its parity test.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from localchat.errors import UnsupportedArchitectureError

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
    # A multimodal wrapper whose text LM we run alone: the key its config nests under, and checkpoint
    # name prefixes -> the text model's (None: a part we do not run, e.g. the vision tower; skipped).
    text_config_key: str | None = None
    weight_prefixes: dict[str, str | None] = field(default_factory=dict)


def _entries() -> list[Architecture]:
    qwen_defaults = {"rope_theta": 1_000_000.0}
    return [
        Architecture("llama", "llama", gguf_arch="llama", gguf_permuted_qk=True),
        # llama.cpp writes Mistral (v0.1-v0.3, Nemo) as "llama": such files load as model_type llama.
        Architecture("mistral", "llama"),
        Architecture(
            "qwen2",
            "llama",
            hf_defaults={**qwen_defaults, "attention_bias": True},
            extra_keys={"o_bias": False},  # Qwen2 puts a bias on q, k and v only
            gguf_arch="qwen2",
        ),
        Architecture(
            "qwen3",
            "qwen3",
            layer_weights={**LLAMA_LAYER_WEIGHTS, **QK_NORM_WEIGHTS},
            hf_defaults=qwen_defaults,
            gguf_arch="qwen3",
        ),
        # Ministral-8B-Instruct-2410: Mistral's layout (transformers 5 nests its rope settings).
        Architecture("ministral", "llama"),
        # Ministral 3 (3B / 8B / 14B): Mistral's layer plus a per-token q temperature after RoPE (beta in
        # rope_parameters; GGUF: attention.temperature_scale). llama.cpp's `mistral3` arch is this text
        # model (also Mistral Small 3.x converted lately, with no temperature), q/k rows permuted.
        Architecture(
            "ministral3",
            "ministral3",
            extra_keys={"llama_4_scaling_beta": None},
            gguf_arch="mistral3",
            gguf_metadata={"attention.temperature_scale": "llama_4_scaling_beta"},
            gguf_permuted_qk=True,
        ),
        # Mistral Small 3.1 / 3.2 (Mistral3ForConditionalGeneration): its text LM only, images unsupported.
        Architecture(
            "mistral3",
            "llama",
            text_config_key="text_config",
            weight_prefixes={
                "language_model.model.": "model.",  # how transformers saves it on disk
                "language_model.lm_head.": "lm_head.",
                "model.language_model.": "model.",  # its in-memory names
                "vision_tower.": None,
                "multi_modal_projector.": None,
                "model.vision_tower.": None,
                "model.multi_modal_projector.": None,
            },
        ),
        # Phi-3 / 3.5-mini, Phi-4-mini: Llama's layer on fused checkpoint tensors, partial rotary, longrope.
        Architecture(
            "phi3",
            "phi3",
            layer_weights=PHI3_LAYER_WEIGHTS,
            hf_defaults={"rms_norm_eps": 1e-5, "original_max_position_embeddings": 4096},
            gguf_arch="phi3",
            gguf_block_names=PHI3_GGUF_BLOCK_NAMES,
        ),
    ]


ARCHITECTURES: dict[str, Architecture] = {a.model_type: a for a in _entries()}
SUPPORTED_MODEL_TYPES = tuple(ARCHITECTURES)
GGUF_ARCHITECTURES: dict[str, Architecture] = {a.gguf_arch: a for a in _entries() if a.gguf_arch}


def architecture(model_type: str) -> Architecture:
    if model_type not in ARCHITECTURES:
        raise UnsupportedArchitectureError(model_type, list(SUPPORTED_MODEL_TYPES))
    return ARCHITECTURES[model_type]
