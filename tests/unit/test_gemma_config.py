"""Gemma config.json forms: the Hub's (flat rope keys, a sliding-window period) and transformers 5's
(`layer_types`, rope parameters per layer type) read into the same `ModelConfig`."""

from __future__ import annotations

from typing import Any

from localchat.weights.config import ModelConfig

SIZES = {
    "vocab_size": 262144,
    "hidden_size": 1152,
    "intermediate_size": 6912,
    "num_hidden_layers": 26,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 256,
}
# gemma-3-1b-it's config.json as published (transformers 4.50 form).
HUB_GEMMA3: dict[str, Any] = {
    **SIZES,
    "model_type": "gemma3_text",
    "rope_theta": 1_000_000.0,
    "rope_local_base_freq": 10_000.0,
    "rope_scaling": None,
    "sliding_window": 512,
    "sliding_window_pattern": 6,
    "query_pre_attn_scalar": 256,
    "final_logit_softcapping": None,
    "attn_logit_softcapping": None,
}
EXPECTED_TYPES = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(26)]


def test_hub_gemma3_config_alternates_five_sliding_layers_and_one_global() -> None:
    config = ModelConfig.from_hf_dict(HUB_GEMMA3)
    assert config.extra["layer_types"] == EXPECTED_TYPES
    assert config.sliding_window == 512 and config.rope_theta == 1_000_000.0
    assert config.extra["rope_local_base_freq"] == 10_000.0
    assert config.tie_word_embeddings  # Gemma ties the LM head to the embedding by default


def test_transformers5_gemma3_config_reads_rope_per_layer_type() -> None:
    nested = {k: v for k, v in HUB_GEMMA3.items() if k not in ("rope_theta", "rope_local_base_freq")}
    nested["layer_types"] = EXPECTED_TYPES
    nested["rope_parameters"] = {
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 500_000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 20_000.0},
    }
    config = ModelConfig.from_hf_dict(nested)
    assert config.rope_theta == 500_000.0  # the global layers' base, not the registry default
    assert config.rope_scaling == {"rope_type": "linear", "factor": 8.0}
    assert config.extra["rope_local_base_freq"] == 20_000.0
    assert config.extra["layer_types"] == EXPECTED_TYPES


def test_gemma2_defaults_alternate_sliding_and_global() -> None:
    config = ModelConfig.from_hf_dict({**SIZES, "model_type": "gemma2", "num_hidden_layers": 4})
    assert config.extra["layer_types"] == ["sliding_attention", "full_attention"] * 2
    assert config.extra["attn_logit_softcapping"] == 50.0 and config.extra["final_logit_softcapping"] == 30.0
    assert config.sliding_window == 4096 and config.extra["rope_local_base_freq"] is None
