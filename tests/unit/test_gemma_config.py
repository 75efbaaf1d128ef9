"""Gemma config.json forms: the Hub's (flat rope keys, a sliding-window period) and transformers 5's
(`layer_types`, rope parameters per layer type) read into the same `ModelConfig`; a multimodal Gemma 3
config reads its nested text model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from localchat.weights.config import ModelConfig
from localchat.weights.safetensors import checkpoint_prefixes, config_from_folder

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


# gemma-3-4b-it's config.json as published (Gemma3ForConditionalGeneration, transformers 4.50): the
# text_config lists only what differs from Gemma3TextConfig's defaults. Vision settings trimmed.
HUB_GEMMA3_4B: dict[str, Any] = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "boi_token_index": 255999,
    "eoi_token_index": 256000,
    "eos_token_id": [1, 106],
    "image_token_index": 262144,
    "mm_tokens_per_image": 256,
    "model_type": "gemma3",
    "text_config": {
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "model_type": "gemma3_text",
        "num_hidden_layers": 34,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    },
    "torch_dtype": "bfloat16",
    "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152},
}


def test_hub_gemma3_4b_multimodal_config_reads_its_text_model(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(HUB_GEMMA3_4B))
    config = config_from_folder(tmp_path)
    assert config.model_type == "gemma3_text"
    assert (config.vocab_size, config.hidden_size, config.num_hidden_layers) == (262_208, 2560, 34)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (8, 4, 256)
    assert config.extra["query_pre_attn_scalar"] == 256 and config.max_position_embeddings == 131_072
    assert config.rope_theta == 1_000_000.0 and config.extra["rope_local_base_freq"] == 10_000.0
    assert config.rope_scaling == {"factor": 8.0, "rope_type": "linear"}
    assert config.extra["layer_types"] == [
        "full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(34)
    ]
    assert config.sliding_window == 1024 and config.tie_word_embeddings
    assert config.eos_token_ids == [1, 106] and config.torch_dtype == "bfloat16"
    assert checkpoint_prefixes(tmp_path)["language_model.model."] == "model."
