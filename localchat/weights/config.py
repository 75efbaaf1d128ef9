"""Backend-neutral model configuration, read from a Hugging Face config.json or GGUF metadata."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


@dataclass(slots=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None  # e.g. {"rope_type": "llama3", "factor": 8.0, ...}
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # qwen2: q/k/v projections carry a bias
    sliding_window: int | None = None  # recorded; attention is full-context (see docs/architecture.md)
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    torch_dtype: str | None = None  # the checkpoint's own dtype, e.g. "bfloat16"

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> ModelConfig:
        """Build from config.json. Unknown keys are ignored; rope settings may be nested (transformers 5)."""
        model_type = str(d.get("model_type", ""))
        hidden = int(d["hidden_size"])
        heads = int(d["num_attention_heads"])
        rope_params = d.get("rope_parameters") or {}
        rope_theta = d.get("rope_theta", rope_params.get("rope_theta"))
        if rope_theta is None:
            rope_theta = 1_000_000.0 if model_type in ("qwen2", "qwen3") else 10000.0
        scaling = d.get("rope_scaling") or None
        if scaling is None and rope_params.get("rope_type") not in (None, "default"):
            scaling = {k: v for k, v in rope_params.items() if k != "rope_theta"}
        if scaling is not None and "rope_type" not in scaling and "type" in scaling:
            scaling = {**scaling, "rope_type": scaling["type"]}
        if scaling is not None and scaling.get("rope_type") in (None, "default"):
            scaling = None
        eos = d.get("eos_token_id")
        eos_ids = [int(e) for e in eos] if isinstance(eos, list) else ([] if eos is None else [int(eos)])
        sliding = d.get("sliding_window") if d.get("use_sliding_window", True) else None
        return cls(
            model_type=model_type,
            vocab_size=int(d["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(d["intermediate_size"]),
            num_hidden_layers=int(d["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(d.get("num_key_value_heads") or heads),
            head_dim=int(d.get("head_dim") or hidden // heads),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope_theta),
            rope_scaling=scaling,
            max_position_embeddings=int(d.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=bool(d.get("attention_bias", model_type == "qwen2")),
            sliding_window=int(sliding) if sliding else None,
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=eos_ids,
            torch_dtype=d.get("torch_dtype") or d.get("dtype"),
        )
