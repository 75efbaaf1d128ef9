"""One entry per supported architecture: everything about it that is not backend compute.

An entry names the backend module that computes it (`family`: `localchat/backends/<lib>/models/<family>.py`),
how its Hugging Face config differs from Llama's defaults, which extra config keys its model file reads,
how its checkpoint names map onto the family's parameters, and how llama.cpp writes it in a GGUF file.
Adding an architecture = one entry here + one model file per backend + its parity test.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from localchat.arch import deepseek, families, qwen3_next, ssm
from localchat.arch.architecture import (
    DEEPSEEK_EXTRA_KEYS,
    DEEPSEEK_FLOAT32,
    DEEPSEEK_GGUF_BLOCK_NAMES,
    DEEPSEEK_GGUF_METADATA,
    DEEPSEEK_WEIGHTS,
    GEMMA_GGUF_BLOCK_NAMES,
    GEMMA_LAYER_WEIGHTS,
    LLAMA_LAYER_WEIGHTS,
    MIXTRAL_GGUF_BLOCK_NAMES,
    MIXTRAL_WEIGHTS,
    MOE_EXTRA_KEYS,
    PHI3_GGUF_BLOCK_NAMES,
    PHI3_LAYER_WEIGHTS,
    QK_NORM_WEIGHTS,
    QWEN3_MOE_GGUF_BLOCK_NAMES,
    QWEN3_MOE_WEIGHTS,
    Architecture,
)
from localchat.errors import UnsupportedArchitectureError

if TYPE_CHECKING:
    pass

# The text LM's names in a multimodal checkpoint: as transformers saves it on disk (also the hub files'
# layout), then transformers 5's in-memory names; the vision tower and projector are not run.
MULTIMODAL_TEXT_PREFIXES: dict[str, str | None] = {
    "language_model.model.": "model.",
    "language_model.lm_head.": "lm_head.",
    "model.language_model.": "model.",
    "vision_tower.": None,
    "multi_modal_projector.": None,
    "model.vision_tower.": None,
    "model.multi_modal_projector.": None,
}
# LLaVA-NeXT adds the learned row-end vector of its image features, loaded with the tower.
LLAVA_NEXT_PREFIXES = {**MULTIMODAL_TEXT_PREFIXES, "image_newline": None, "model.image_newline": None}
# Qwen2.5-VL / Qwen3-VL checkpoints: the text LM under either layout; the tower (`visual.`) is loaded apart.
QWEN_VL_PREFIXES: dict[str, str | None] = {
    "model.language_model.": "model.",
    "language_model.model.": "model.",
    "language_model.lm_head.": "lm_head.",
    "model.visual.": None,
    "visual.": None,
}
# SmolVLM / Idefics3 checkpoints (hub files and transformers 5 alike): the text LM under `model.text_model.`,
# the tower and connector loaded apart.
SMOLVLM_PREFIXES: dict[str, str | None] = {
    "model.text_model.": "model.",
    "model.vision_model.": None,
    "model.connector.": None,
}
# M-RoPE's split of the rotary frequencies over (temporal, height, width), from the rope settings.
MROPE_KEYS = {"mrope_section": None, "mrope_interleaved": False}
# llama.cpp writes the sections as [t, h, w, 0]; the trailing 0 adds no frequencies.
MROPE_GGUF_METADATA = {"rope.dimension_sections": "mrope_section"}
# transformers' Gemma3TextConfig defaults (the Gemma 3 1B sizes): the text_config of a Gemma 3 4B/12B/27B
# config.json lists only the keys that differ from them.
GEMMA3_TEXT_DEFAULTS = {
    "vocab_size": 262_208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "max_position_embeddings": 131_072,
    "query_pre_attn_scalar": 256,
    "bos_token_id": 2,
    "eos_token_id": 1,
}


def _entries() -> list[Architecture]:
    qwen_defaults = {"rope_theta": 1_000_000.0}
    gemma_defaults = {"head_dim": 256, "tie_word_embeddings": True, "rms_norm_eps": 1e-6}
    # `layer_types` None: every `sliding_window_pattern`-th layer is global, the others slide.
    # `query_pre_attn_scalar` None (a GGUF, which does not record it): head_dim, as llama.cpp assumes.
    gemma_keys = {"query_pre_attn_scalar": None, "layer_types": None}

    return [
        Architecture(
            "llama", "llama", gguf_arch="llama", gguf_permuted_qk=True, gguf_experts_model_type="mixtral"
        ),
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
        # Qwen2-VL / Qwen2.5-VL / Qwen3-VL (…ForConditionalGeneration): the text LM with M-RoPE, the vision tower in
        # backends/<lib>/vision/qwen_vl.py. A hub config.json of Qwen2.5-VL keeps the text keys at the top.
        Architecture("qwen2_vl", "qwen2_vl", text_config_key="text_config", weight_prefixes=QWEN_VL_PREFIXES),
        Architecture(
            "qwen2_vl_text",
            "qwen2_vl",
            hf_defaults={**qwen_defaults, "attention_bias": True},
            extra_keys={"o_bias": False, **MROPE_KEYS},
            gguf_arch="qwen2vl",  # llama.cpp's name for Qwen2-VL's and Qwen2.5-VL's text LM
            gguf_metadata=MROPE_GGUF_METADATA,
        ),
        Architecture(
            "qwen2_5_vl", "qwen2_vl", text_config_key="text_config", weight_prefixes=QWEN_VL_PREFIXES
        ),
        Architecture(
            "qwen2_5_vl_text",
            "qwen2_vl",
            hf_defaults={**qwen_defaults, "attention_bias": True},
            extra_keys={"o_bias": False, **MROPE_KEYS},
        ),
        Architecture("qwen3_vl", "qwen3_vl", text_config_key="text_config", weight_prefixes=QWEN_VL_PREFIXES),
        Architecture(
            "qwen3_vl_text",
            "qwen3_vl",
            layer_weights={**LLAMA_LAYER_WEIGHTS, **QK_NORM_WEIGHTS},
            hf_defaults=qwen_defaults,
            # transformers' Qwen3-VL always interleaves; a GGUF does not record it
            extra_keys={**MROPE_KEYS, "mrope_interleaved": True},
            gguf_arch="qwen3vl",
            gguf_metadata=MROPE_GGUF_METADATA,
        ),
        # Qwen3-VL-MoE as llama.cpp writes it (`qwen3vlmoe`, experts unpacked); its safetensors folders (packed,
        # transposed experts) are not read yet.
        Architecture(
            "qwen3_vl_moe_text",
            "qwen3_vl_moe",
            layer_weights={**LLAMA_LAYER_WEIGHTS, **QK_NORM_WEIGHTS, **QWEN3_MOE_WEIGHTS},
            hf_defaults=qwen_defaults,
            extra_keys={**MOE_EXTRA_KEYS, **MROPE_KEYS, "mrope_interleaved": True},
            gguf_arch="qwen3vlmoe",
            gguf_block_names=QWEN3_MOE_GGUF_BLOCK_NAMES,
            gguf_metadata={
                "expert_count": "num_experts",
                "expert_used_count": "num_experts_per_tok",
                "expert_feed_forward_length": "moe_intermediate_size",
                **MROPE_GGUF_METADATA,
            },
        ),
        Architecture(
            "qwen3_moe",
            "qwen3_moe",
            layer_weights={**LLAMA_LAYER_WEIGHTS, **QK_NORM_WEIGHTS, **QWEN3_MOE_WEIGHTS},
            # transformers' default; llama.cpp's qwen3moe always renormalises (MOE_EXTRA_KEYS)
            hf_defaults={**qwen_defaults, "norm_topk_prob": False},
            extra_keys=MOE_EXTRA_KEYS,
            gguf_arch="qwen3moe",
            gguf_block_names=QWEN3_MOE_GGUF_BLOCK_NAMES,
            gguf_metadata={
                "expert_count": "num_experts",
                "expert_used_count": "num_experts_per_tok",
                "expert_feed_forward_length": "moe_intermediate_size",
                "expert_weights_norm": "norm_topk_prob",
            },
        ),
        Architecture(
            "mixtral",
            "mixtral",
            layer_weights={**LLAMA_LAYER_WEIGHTS, **MIXTRAL_WEIGHTS},
            hf_defaults={"rope_theta": 1_000_000.0},
            extra_keys=MOE_EXTRA_KEYS,
            # No gguf_arch of its own: a "llama" file with experts (the llama entry's hook).
            gguf_block_names=MIXTRAL_GGUF_BLOCK_NAMES,
            gguf_expert_names={
                "ffn_gate": "block_sparse_moe.experts.{e}.w1",
                "ffn_up": "block_sparse_moe.experts.{e}.w3",
                "ffn_down": "block_sparse_moe.experts.{e}.w2",
            },
            gguf_metadata={"expert_count": "num_local_experts", "expert_used_count": "num_experts_per_tok"},
            gguf_permuted_qk=True,
        ),
        Architecture(
            "gemma2",
            "gemma",
            layer_weights=GEMMA_LAYER_WEIGHTS,
            hf_defaults={**gemma_defaults, "sliding_window": 4096},
            extra_keys={
                **gemma_keys,
                "attn_logit_softcapping": 50.0,
                "final_logit_softcapping": 30.0,
                "sliding_window_pattern": 2,
                "rope_local_base_freq": None,  # one RoPE for every layer
                "qk_norm": False,
            },
            gguf_arch="gemma2",
            gguf_metadata={
                "attn_logit_softcapping": "attn_logit_softcapping",
                "final_logit_softcapping": "final_logit_softcapping",
            },
            gguf_block_names=GEMMA_GGUF_BLOCK_NAMES,
            gguf_norm_offset=1.0,
            gguf_wide_query_scale_layers=46,  # Gemma 2 27B: 4608 / 32 = 144, head_dim 128
        ),
        Architecture(
            "gemma3_text",
            "gemma",
            layer_weights={**GEMMA_LAYER_WEIGHTS, **QK_NORM_WEIGHTS},
            hf_defaults={
                **gemma_defaults,
                **GEMMA3_TEXT_DEFAULTS,
                "sliding_window": 4096,
                "rope_theta": 1_000_000.0,
            },
            extra_keys={
                **gemma_keys,
                "attn_logit_softcapping": None,
                "final_logit_softcapping": None,
                "sliding_window_pattern": 6,
                "rope_local_base_freq": 10_000.0,
                "qk_norm": True,
            },
            gguf_arch="gemma3",
            gguf_metadata={
                "final_logit_softcapping": "final_logit_softcapping",
                "rope.freq_base_swa": "rope_local_base_freq",
            },
            gguf_block_names=GEMMA_GGUF_BLOCK_NAMES,
            gguf_norm_offset=1.0,
            gguf_wide_query_scale_layers=62,  # Gemma 3 27B: 5376 / 32 = 168, head_dim 128
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
            weight_prefixes=MULTIMODAL_TEXT_PREFIXES,
        ),
        # LLaVA 1.5 and its fine-tunes (LlavaForConditionalGeneration): the text LM (llama / mistral) runs
        # as its own family, the CLIP tower + MLP projector in backends/<lib>/vision/llava.py.
        Architecture(
            "llava", "llama", text_config_key="text_config", weight_prefixes=MULTIMODAL_TEXT_PREFIXES
        ),
        # LLaVA-NeXT / 1.6 (LlavaNextForConditionalGeneration): the same, anyres tiling in llava_next.py.
        Architecture(
            "llava_next", "llama", text_config_key="text_config", weight_prefixes=LLAVA_NEXT_PREFIXES
        ),
        # SmolVLM / Idefics3 (SmolVLMForConditionalGeneration, Idefics3ForConditionalGeneration): the Llama
        # text LM; the SigLIP tower + pixel-shuffle connector run in backends/<lib>/vision/smolvlm.py.
        Architecture("smolvlm", "llama", text_config_key="text_config", weight_prefixes=SMOLVLM_PREFIXES),
        Architecture("idefics3", "llama", text_config_key="text_config", weight_prefixes=SMOLVLM_PREFIXES),
        # Gemma 3 4B / 12B / 27B (Gemma3ForConditionalGeneration): its gemma3_text LM only, images
        # unsupported. GGUF files of them are `gemma3` text models (the vision tower is a separate mmproj).
        Architecture(
            "gemma3", "gemma", text_config_key="text_config", weight_prefixes=MULTIMODAL_TEXT_PREFIXES
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
        # DeepSeek-V2 / V2-Lite (softmax router) and V3 / R1 (sigmoid router with a bias): one family. llama.cpp writes both as "deepseek2"; its metadata says which router it is,
        # so such files load as deepseek_v2 and run the router the file names.
        Architecture(
            "deepseek_v2",
            "deepseek",
            layer_weights=DEEPSEEK_WEIGHTS,
            hf_defaults={"topk_method": "greedy"},
            extra_keys=DEEPSEEK_EXTRA_KEYS,
            gguf_arch="deepseek2",
            gguf_block_names=DEEPSEEK_GGUF_BLOCK_NAMES,
            gguf_metadata=DEEPSEEK_GGUF_METADATA,
            derive_sizes=deepseek.derive_sizes,
            sanitize=deepseek.sanitize,
            float32_params=DEEPSEEK_FLOAT32,
            gguf_yarn_log_mul_per_mscale=0.1,
        ),
        Architecture(
            "deepseek_v3",
            "deepseek",
            layer_weights=DEEPSEEK_WEIGHTS,
            # transformers' DeepseekV3Config defaults where a config.json leaves them out
            hf_defaults={
                "scoring_func": "sigmoid",
                "norm_topk_prob": True,
                "routed_scaling_factor": 2.5,
                "n_group": 8,
                "topk_group": 4,
            },
            extra_keys=DEEPSEEK_EXTRA_KEYS,
            derive_sizes=deepseek.derive_sizes,
            sanitize=deepseek.sanitize,
            float32_params=DEEPSEEK_FLOAT32,
        ),
        *families.entries(),  # SmolLM3, ... (arch/families.py)
    ]


def _hybrid_entries() -> list[Architecture]:
    """Hybrid models: linear-attention layers with a per-sequence state beside full attention
    (engine/state_slots.py)."""
    qwen3_5_text = Architecture(
        "qwen3_5_text",
        "qwen3_next",
        layer_weights=qwen3_next.QWEN3_5_LAYER_WEIGHTS,
        hf_defaults=qwen3_next.QWEN3_5_HF_DEFAULTS,
        extra_keys=qwen3_next.QWEN3_5_EXTRA_KEYS,
        derive_sizes=qwen3_next.derive_sizes,
        sanitize=qwen3_next.sanitize_qwen3_5,
        float32_params=qwen3_next.QWEN3_5_FLOAT32,
        state_bytes=qwen3_next.state_bytes_per_sequence,
        gguf_arch="qwen35",
        gguf_block_names=qwen3_next.QWEN35_GGUF_BLOCK_NAMES,
        gguf_metadata=qwen3_next.QWEN35_GGUF_METADATA,
    )
    # Qwen3.5 as published (Qwen3_5ForConditionalGeneration): its text LM only, images unsupported.
    wrapper = Architecture(
        "qwen3_5", "qwen3_next", text_config_key="text_config", weight_prefixes=qwen3_next.QWEN3_5_PREFIXES
    )
    # Qwen3-Next-80B-A3B: the same hybrid stack, projections grouped per key head (sanitize splits them),
    # every MLP a sparse MoE with a sigmoid-gated shared expert.
    qwen3_next_arch = Architecture(
        "qwen3_next",
        "qwen3_next",
        layer_weights={
            **qwen3_next.QWEN3_5_LAYER_WEIGHTS,
            **QWEN3_MOE_WEIGHTS,
            **qwen3_next.QWEN3_NEXT_SHARED_WEIGHTS,
        },
        hf_defaults=qwen3_next.QWEN3_5_HF_DEFAULTS,
        extra_keys=qwen3_next.QWEN3_NEXT_EXTRA_KEYS,
        derive_sizes=qwen3_next.derive_sizes,
        sanitize=qwen3_next.sanitize,
        float32_params=qwen3_next.QWEN3_5_FLOAT32,
        state_bytes=qwen3_next.state_bytes_per_sequence,
        gguf_arch="qwen3next",
        gguf_block_names=qwen3_next.QWEN35_GGUF_BLOCK_NAMES,
        gguf_metadata=qwen3_next.QWEN35_GGUF_METADATA,
    )
    # Qwen3.5-MoE (35B-A3B, 122B-A10B, 397B-A17B): Qwen3.5's layers, Qwen3-Next's MoE; and its wrapper.
    qwen3_5_moe_text = Architecture(
        "qwen3_5_moe_text",
        "qwen3_next",
        layer_weights=qwen3_next_arch.layer_weights,
        # No dense MLP anywhere: its configs carry no intermediate_size (0: none is built).
        hf_defaults={**qwen3_next.QWEN3_5_HF_DEFAULTS, "norm_topk_prob": True, "intermediate_size": 0},
        extra_keys=qwen3_next.QWEN3_5_MOE_EXTRA_KEYS,
        derive_sizes=qwen3_next.derive_sizes,
        sanitize=qwen3_next.sanitize_qwen3_5,
        float32_params=qwen3_next.QWEN3_5_FLOAT32,
        state_bytes=qwen3_next.state_bytes_per_sequence,
        gguf_arch="qwen35moe",
        gguf_block_names=qwen3_next.QWEN35_GGUF_BLOCK_NAMES,
        gguf_metadata=qwen3_next.QWEN35_GGUF_METADATA,
    )
    moe_wrapper = Architecture(
        "qwen3_5_moe",
        "qwen3_next",
        text_config_key="text_config",
        weight_prefixes=qwen3_next.QWEN3_5_PREFIXES,
    )
    return [qwen3_5_text, wrapper, qwen3_next_arch, qwen3_5_moe_text, moe_wrapper, *ssm.entries(Architecture)]


ARCHITECTURES: dict[str, Architecture] = {a.model_type: a for a in [*_entries(), *_hybrid_entries()]}
SUPPORTED_MODEL_TYPES = tuple(ARCHITECTURES)
GGUF_ARCHITECTURES: dict[str, Architecture] = {a.gguf_arch: a for a in ARCHITECTURES.values() if a.gguf_arch}


def architecture(model_type: str) -> Architecture:
    if model_type not in ARCHITECTURES:
        raise UnsupportedArchitectureError(model_type, list(SUPPORTED_MODEL_TYPES))
    return ARCHITECTURES[model_type]
