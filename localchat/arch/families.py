"""Registry entries for the plain-transformer families of 2025-26 (SmolLM3, ...): Llama-like layers
that differ in a detail or two. Kept out of registry.py so that file stays one screen of the older
families; `registry._entries` appends these.

`entries` takes the `Architecture` class as an argument: this module is imported by registry.py,
which defines it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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
    ]
