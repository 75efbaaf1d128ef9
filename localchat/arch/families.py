"""Registry entries for the plain-transformer families of 2025-26 (SmolLM3, Gemma 4, ...): Llama-like layers
that differ in a detail or two. Kept out of registry.py so that file stays one screen of the older
families; `registry._entries` appends these.

`entries` takes the `Architecture` class as an argument: this module is imported by registry.py,
which defines it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from localchat.arch import gemma4

if TYPE_CHECKING:
    from localchat.arch.registry import Architecture


def entries(arch: type[Architecture]) -> list[Architecture]:
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
    ]
