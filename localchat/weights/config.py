"""Backend-neutral model configuration, read from a Hugging Face config.json or GGUF metadata."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from localchat.arch.registry import ARCHITECTURES, SUPPORTED_MODEL_TYPES

__all__ = ["SUPPORTED_MODEL_TYPES", "ModelConfig"]


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
    sliding_window: int | None = None  # the attention window of the layers that slide (all, in Mistral)
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    torch_dtype: str | None = None  # the checkpoint's own dtype, e.g. "bfloat16"
    partial_rotary_factor: float = 1.0  # RoPE turns only the first head_dim * factor dims
    # Architecture-specific settings its model files read: the registry entry's `extra_keys`.
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if "layer_types" in self.extra and self.extra["layer_types"] is None:
            # Older configs (and GGUF) give the alternation as a period: every `pattern`-th layer is global.
            pattern = int(self.extra.get("sliding_window_pattern") or 1)
            self.extra["layer_types"] = [
                "sliding_attention" if (i + 1) % pattern else "full_attention"
                for i in range(self.num_hidden_layers)
            ]
        arch = ARCHITECTURES.get(self.model_type)
        if arch is not None and arch.derive_sizes is not None:
            arch.derive_sizes(self)

    @property
    def rotary_dim(self) -> int:
        return round(self.head_dim * self.partial_rotary_factor)  # round: 192 * (64 / 192) is 63.99...

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> ModelConfig:
        """Build from config.json. Unknown keys are ignored; rope settings may be nested (transformers 5)."""
        model_type = str(d.get("model_type", ""))
        arch = ARCHITECTURES.get(model_type)
        if arch is not None:
            defaults = dict(arch.hf_defaults)
            nested = d.get("rope_parameters") or {}
            if "rope_theta" in nested or "full_attention" in nested:  # transformers 5 nests it
                defaults.pop("rope_theta", None)
            d = {**defaults, **{k: v for k, v in d.items() if v is not None}}
        hidden = int(d["hidden_size"])
        heads = int(d["num_attention_heads"])
        rope_params = d.get("rope_parameters") or {}
        if "full_attention" in rope_params:  # per layer type (transformers 5, Gemma 3)
            local = (rope_params.get("sliding_attention") or {}).get("rope_theta")
            if local is not None:
                d = {**d, "rope_local_base_freq": local}
            rope_params = rope_params["full_attention"] or {}
        rope_theta = d.get("rope_theta", rope_params.get("rope_theta"))
        if rope_theta is None:
            rope_theta = 10000.0
        scaling = d.get("rope_scaling") or None
        if scaling is None and rope_params.get("rope_type") not in (None, "default"):
            scaling = {k: v for k, v in rope_params.items() if k != "rope_theta"}
        if scaling is not None and "rope_type" not in scaling and "type" in scaling:
            scaling = {**scaling, "rope_type": scaling["type"]}
        if scaling is not None and scaling.get("rope_type") in (None, "default", "mrope"):  # mrope: default's
            scaling = None
        if scaling is not None and d.get("original_max_position_embeddings"):
            # Phi-3 keeps the pretraining length at the top level; like transformers, it wins.
            scaling = {
                **scaling,
                "original_max_position_embeddings": int(d["original_max_position_embeddings"]),
            }
        # An extra key may sit among the rope settings (Ministral 3's llama_4_scaling_beta).
        nested_rope = {**(d.get("rope_scaling") or {}), **rope_params}
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
            attention_bias=bool(d.get("attention_bias", False)),
            sliding_window=int(sliding) if sliding else None,
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=eos_ids,
            torch_dtype=d.get("torch_dtype") or d.get("dtype"),
            partial_rotary_factor=float(
                d.get("partial_rotary_factor", rope_params.get("partial_rotary_factor", 1.0))
            ),
            extra={
                k: d.get(k, nested_rope.get(k, default))
                for k, default in (arch.extra_keys if arch else {}).items()
            },
        )
