"""Registry entries for the plain-transformer families of 2025-26 (SmolLM3, Gemma 4, Mistral 4, GLM-4.5, Llama 4): Llama-like layers
that differ in a detail or two. Kept out of registry.py so that file stays one screen of the older
families; `registry._entries` appends these.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from localchat.arch import deepseek, gemma4, gpt_oss, llama4, nextn
from localchat.arch.architecture import (
    DEEPSEEK_EXTRA_KEYS,
    DEEPSEEK_FLOAT32,
    DEEPSEEK_GGUF_BLOCK_NAMES,
    DEEPSEEK_GGUF_METADATA,
    DEEPSEEK_WEIGHTS,
    LLAMA_LAYER_WEIGHTS,
    QK_NORM_WEIGHTS,
    Architecture,
)
from localchat.errors import ModelLoadError

if TYPE_CHECKING:
    from localchat.weights.config import ModelConfig
    from localchat.weights.tensors import WeightTensor


def entries() -> list[Architecture]:
    return [
        # SmolLM3: Llama's layer with no RoPE on every 4th layer (`no_rope_layers`; llama.cpp's smollm3
        # records no list and assumes that interval); with use_sliding_window only those layers slide.
        Architecture(
            "smollm3",
            "smollm3",
            hf_defaults={"rope_theta": 2_000_000.0, "tie_word_embeddings": True, "use_sliding_window": False},
            extra_keys={"no_rope_layers": None, "no_rope_layer_interval": 4, "layer_types": None},
            gguf_arch="smollm3",
            gguf_permuted_qk=True,
        ),
        # Gemma 4 dense text models (arch/gemma4.py), and the multimodal checkpoints' text LM.
        Architecture(
            "gemma4_text",
            "gemma4",
            layer_weights=gemma4.LAYER_WEIGHTS,
            hf_defaults=gemma4.HF_DEFAULTS,
            extra_keys=gemma4.EXTRA_KEYS,
            derive_sizes=gemma4.derive_sizes,
            top_weights=gemma4.TOP_WEIGHTS,
            sanitize=gemma4.sanitize,
            gguf_arch="gemma4",
            gguf_block_names=gemma4.GGUF_BLOCK_NAMES,
            gguf_hf_config=gemma4.hf_config_from_gguf,
        ),
        Architecture("gemma4", "gemma4", text_config_key="text_config", weight_prefixes=gemma4.TEXT_PREFIXES),
        # Mistral 4 (Mistral Small 4): DeepSeek-V3's checkpoint layout and MLA, a softmax router without
        # bias, Ministral 3's q temperature (`llama_4_scaling_beta` among the rope settings). Published
        # inside Mistral3ForConditionalGeneration: the `mistral3` entry runs its text LM.
        Architecture(
            "mistral4",
            "mistral4",
            layer_weights={**DEEPSEEK_WEIGHTS, **MISTRAL4_GGUF_EXPERTS},
            hf_defaults={"scoring_func": "softmax", "norm_topk_prob": True, "routed_scaling_factor": 1.0},
            extra_keys={**DEEPSEEK_EXTRA_KEYS, "llama_4_scaling_beta": None},
            derive_sizes=_mistral4_sizes,
            sanitize=deepseek.sanitize,
            float32_params=DEEPSEEK_FLOAT32,
            # llama.cpp's mistral4: DeepSeek-V2's tensors and keys, gate|up stacked in one tensor; its
            # converter writes no q temperature (llama_4_scaling_beta), so a file runs without one.
            gguf_arch="mistral4",
            gguf_block_names={**DEEPSEEK_GGUF_BLOCK_NAMES, "ffn_gate_up_exps": "mlp.experts.gate_up_proj"},
            gguf_metadata={**DEEPSEEK_GGUF_METADATA, "attention.temperature_scale": "llama_4_scaling_beta"},
            gguf_yarn_log_mul_per_mscale=0.1,
        ),
        # GLM-4.5 / 4.6 / 4.7: Llama attention (q/k/v bias, partial rotary, optional q/k norm) and DeepSeek-V3's
        # MoE after the leading dense layers; its multi-token-prediction layers are dropped at load.
        Architecture(
            "glm4_moe",
            "glm4_moe",
            layer_weights={
                **LLAMA_LAYER_WEIGHTS,
                **QK_NORM_WEIGHTS,
                **_shared_expert_moe(),
            },
            hf_defaults={"rms_norm_eps": 1e-5},
            extra_keys={
                **DEEPSEEK_EXTRA_KEYS,
                "o_bias": False,
                "use_qk_norm": False,
                "partial_rotary_factor": None,  # None: not in config.json (`_glm4_moe_sizes`)
                "scoring_func": "sigmoid",
                "norm_topk_prob": True,
                "n_shared_experts": 1,
                "first_k_dense_replace": 1,
                "num_experts_per_tok": 8,
            },
            derive_sizes=_glm4_moe_sizes,
            sanitize=_drop_mtp_layers,
            float32_params=DEEPSEEK_FLOAT32,
            # llama.cpp's glm4moe: q/k rows as in the checkpoint, the norm before the MoE named
            # post_attention_norm, the multi-token-prediction block counted in block_count.
            gguf_arch="glm4moe",
            gguf_block_names={
                **DEEPSEEK_GGUF_BLOCK_NAMES,
                "post_attention_norm": "post_attention_layernorm",
                **nextn.NEXTN_GGUF_BLOCK_NAMES,  # read by --speculative mtp, dropped for the model
            },
            gguf_metadata={
                **{k: v for k, v in DEEPSEEK_GGUF_METADATA.items() if k.startswith(("expert", "leading"))},
                "nextn_predict_layers": "gguf_nextn_layers",
                "rope.dimension_count": "gguf_rope_dims",
            },
        ),
        # Llama 4 Scout / Maverick (arch/llama4.py): the text model, and the multimodal checkpoints' text LM.
        Architecture(
            "llama4_text",
            "llama4",
            layer_weights=llama4.LAYER_WEIGHTS,
            hf_defaults=llama4.HF_DEFAULTS,
            extra_keys=llama4.EXTRA_KEYS,
            derive_sizes=llama4.derive_sizes,
            sanitize=llama4.sanitize,
            gguf_arch="llama4",
            gguf_block_names=llama4.GGUF_BLOCK_NAMES,
            gguf_metadata=llama4.GGUF_METADATA,
        ),
        Architecture("llama4", "llama4", text_config_key="text_config", weight_prefixes=llama4.TEXT_PREFIXES),
        # gpt-oss 20B / 120B (arch/gpt_oss.py): attention sinks, alternating windows, biased clamped experts.
        Architecture(
            "gpt_oss",
            "gpt_oss",
            layer_weights={**LLAMA_LAYER_WEIGHTS, **gpt_oss.LAYER_WEIGHTS},
            hf_defaults=gpt_oss.HF_DEFAULTS,
            extra_keys=gpt_oss.EXTRA_KEYS,
            derive_sizes=gpt_oss.derive_sizes,
            sanitize=gpt_oss.sanitize,
            gguf_arch="gpt-oss",
            gguf_block_names=gpt_oss.GGUF_BLOCK_NAMES,
            gguf_metadata=gpt_oss.GGUF_METADATA,
        ),
    ]


# A mistral4 GGUF's stacked gate|up tensor, split per expert (its name keeps the file's `.weight`).
MISTRAL4_GGUF_EXPERTS = {"mlp.experts.{e}.gate_up_proj.weight": ("moe.experts.{e}.gate_up", 0, 1)}


def _shared_expert_moe() -> dict[str, tuple[str, int, int]]:
    """DeepSeek-V3's MoE names (router, experts, selection bias, shared expert), without its attention."""
    return {k: v for k, v in DEEPSEEK_WEIGHTS.items() if k.startswith("mlp.")}


def _glm4_moe_sizes(config: ModelConfig) -> None:
    """transformers' Glm4MoeConfig turns half of each head when the config.json names no factor (a GGUF
    gives the rotary dims); llama.cpp's block_count includes the multi-token-prediction layers."""
    x = config.extra
    if x.get("partial_rotary_factor") is None and x.get("gguf_rope_dims") is None:
        config.partial_rotary_factor = 0.5
    if x.get("gguf_nextn_layers"):
        config.num_hidden_layers -= int(x["gguf_nextn_layers"])
        x["gguf_mtp_layers"] = int(x["gguf_nextn_layers"])  # read by --speculative mtp (serving/mtp.py)
        x["gguf_nextn_layers"] = 0  # once: ModelConfig runs this after every construction


def _drop_mtp_layers(config: ModelConfig, weights: Iterable[WeightTensor]) -> Iterator[WeightTensor]:
    """The multi-token-prediction layers stored after the model's own (`model.layers.{num_hidden_layers}`)."""
    for weight in weights:
        parts = weight.name.split(".", 3)
        if (
            parts[:2] == ["model", "layers"]
            and parts[2].isdigit()
            and int(parts[2]) >= config.num_hidden_layers
        ):
            continue
        yield weight


def _mistral4_sizes(config: ModelConfig) -> None:
    """DeepSeek's MLA sizes; grouped routing is refused: Mistral 4 ranks groups by the sum of their two
    best softmax scores, which the DeepSeek router (V2: the best one) does not do."""
    deepseek.derive_sizes(config)
    if int(config.extra.get("n_group") or 1) > 1:
        raise ModelLoadError(
            "This Mistral 4 checkpoint routes experts in groups (n_group > 1), which localchat does not run.",
            code="unsupported_architecture",
        )
