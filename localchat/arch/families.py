"""Registry entries for the plain-transformer families of 2025-26 (SmolLM3, Gemma 4, Mistral 4, ...): Llama-like layers
that differ in a detail or two. Kept out of registry.py so that file stays one screen of the older
families; `registry._entries` appends these.

`entries` takes the `Architecture` class as an argument: this module is imported by registry.py,
which defines it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from localchat.arch import deepseek, gemma4
from localchat.errors import ModelLoadError

if TYPE_CHECKING:
    from localchat.arch.registry import Architecture
    from localchat.weights.config import ModelConfig


def entries(arch: type[Architecture]) -> list[Architecture]:
    from localchat.arch import registry  # defined by the time registry.py calls this

    return [
        # SmolLM3: Llama's layer with no RoPE on every 4th layer (`no_rope_layers`; llama.cpp's smollm3
        # records no list and assumes that interval); with use_sliding_window only those layers slide.
        arch(
            "smollm3",
            "smollm3",
            hf_defaults={"rope_theta": 2_000_000.0, "tie_word_embeddings": True, "use_sliding_window": False},
            extra_keys={"no_rope_layers": None, "no_rope_layer_interval": 4, "layer_types": None},
            gguf_arch="smollm3",
            gguf_permuted_qk=True,
        ),
        # Gemma 4 dense text models (arch/gemma4.py), and the multimodal checkpoints' text LM.
        arch(
            "gemma4_text",
            "gemma4",
            layer_weights=gemma4.LAYER_WEIGHTS,
            hf_defaults=gemma4.HF_DEFAULTS,
            extra_keys=gemma4.EXTRA_KEYS,
            derive_sizes=gemma4.derive_sizes,
        ),
        arch("gemma4", "gemma4", text_config_key="text_config", weight_prefixes=gemma4.TEXT_PREFIXES),
        # Mistral 4 (Mistral Small 4): DeepSeek-V3's checkpoint layout and MLA, a softmax router without
        # bias, Ministral 3's q temperature (`llama_4_scaling_beta` among the rope settings). Published
        # inside Mistral3ForConditionalGeneration: the `mistral3` entry runs its text LM.
        arch(
            "mistral4",
            "mistral4",
            layer_weights=registry.DEEPSEEK_WEIGHTS,
            hf_defaults={"scoring_func": "softmax", "norm_topk_prob": True, "routed_scaling_factor": 1.0},
            extra_keys={**registry.DEEPSEEK_EXTRA_KEYS, "llama_4_scaling_beta": None},
            derive_sizes=_mistral4_sizes,
            sanitize=deepseek.sanitize,
            float32_params=registry.DEEPSEEK_FLOAT32,
        ),
    ]


def _mistral4_sizes(config: ModelConfig) -> None:
    """DeepSeek's MLA sizes; grouped routing is refused: Mistral 4 ranks groups by the sum of their two
    best softmax scores, which the DeepSeek router (V2: the best one) does not do."""
    deepseek.derive_sizes(config)
    if int(config.extra.get("n_group") or 1) > 1:
        raise ModelLoadError(
            "This Mistral 4 checkpoint routes experts in groups (n_group > 1), which localchat does not run.",
            code="unsupported_architecture",
        )
