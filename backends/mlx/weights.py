"""Fill a model weight by weight, fusing q|k|v and gate|up as parts arrive (as backends/torch does).

Each weight is converted and evaluated at once, so peak memory stays near the model's size; fused
matrices hold their parts only until the last one arrives. Quantized GGUF matrices stay quantized
where MLX has a matching format (backends/mlx/quant.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import mlx.core as mx

from backends.mlx.models import model_class
from backends.mlx.models.base import DecoderLM
from backends.mlx.quant import (
    DenseWeight,
    Embedding,
    QuantizedWeight,
    Weight,
    concat_rows,
    to_dense,
    to_embedding,
    to_weight,
)
from localchat.errors import ModelLoadError
from localchat.weights.config import ModelConfig
from localchat.weights.tensors import WeightTensor

# Hugging Face name inside a layer -> (our attribute, part index, number of parts).
LAYER_WEIGHTS: dict[str, tuple[str, int, int]] = {
    "input_layernorm.weight": ("attn_norm", 0, 1),
    "self_attn.q_proj.weight": ("qkv", 0, 3),
    "self_attn.k_proj.weight": ("qkv", 1, 3),
    "self_attn.v_proj.weight": ("qkv", 2, 3),
    "self_attn.q_proj.bias": ("qkv_bias", 0, 3),
    "self_attn.k_proj.bias": ("qkv_bias", 1, 3),
    "self_attn.v_proj.bias": ("qkv_bias", 2, 3),
    "self_attn.q_norm.weight": ("q_norm", 0, 1),
    "self_attn.k_norm.weight": ("k_norm", 0, 1),
    "self_attn.o_proj.weight": ("o", 0, 1),
    "self_attn.o_proj.bias": ("o_bias", 0, 1),
    "post_attention_layernorm.weight": ("mlp_norm", 0, 1),
    "mlp.gate_proj.weight": ("gate_up", 0, 2),
    "mlp.up_proj.weight": ("gate_up", 1, 2),
    "mlp.down_proj.weight": ("down", 0, 1),
}
TOP_WEIGHTS = {"model.embed_tokens.weight": "embed", "model.norm.weight": "norm", "lm_head.weight": "lm_head"}
IGNORED = re.compile(r"(rotary_emb\.inv_freq|\.attn\.masked_bias|\.attn\.bias)$")
LAYER_NAME = re.compile(r"model\.layers\.(\d+)\.(.+)")
LAYER_REQUIRED = ("attn_norm", "qkv", "o", "mlp_norm", "gate_up", "down")
LAYER_OPTIONAL = ("qkv_bias", "o_bias", "q_norm", "k_norm")  # present per `LayerOptions`


def load_model(
    config: ModelConfig, weights: Iterable[WeightTensor], dtype: mx.Dtype, dense_from_rows: int = 0
) -> DecoderLM:
    """`dense_from_rows`: quantized matrices run as transient dense GEMMs for steps of that many rows."""
    model = model_class(config.model_type)(config)
    shapes = _expected_shapes(config)
    pending: dict[tuple[int, str], dict[int, Weight | Embedding]] = {}
    for weight in weights:
        target = _target(model, weight.name)
        if target is None:
            continue
        owner, attr, part, parts = target
        key = attr if parts == 1 else f"{attr}.{part}"
        if tuple(weight.shape) != shapes[key]:
            raise ModelLoadError(
                f"Weight {weight.name!r} has shape {tuple(weight.shape)}, expected {shapes[key]} from the config."
            )
        value = _convert(attr, weight, dtype, dense_from_rows)
        _evaluate(value)
        if parts == 1:
            setattr(owner, attr, value)
            continue
        got = pending.setdefault((id(owner), attr), {})
        got[part] = value
        if len(got) == parts:
            del pending[(id(owner), attr)]
            setattr(owner, attr, _fuse([got[i] for i in range(parts)]))
            _evaluate(getattr(owner, attr))
    # NOTE: an untied checkpoint without lm_head keeps lm_head None and reuses the embedding, as
    # llama.cpp does; `DecoderLM.logits` falls back to it.
    missing = _missing(model)
    if missing or pending:
        names = missing or [f"{attr} (partial)" for _, attr in pending]
        raise ModelLoadError(
            f"The checkpoint lacks weights this {config.model_type} model needs: {', '.join(names[:8])}."
        )
    return model


def _target(model: DecoderLM, name: str) -> tuple[Any, str, int, int] | None:
    if name in TOP_WEIGHTS:
        attr = TOP_WEIGHTS[name]
        if attr == "lm_head" and model.config.tie_word_embeddings:
            return None  # tied: the embedding serves as the LM head
        return model, attr, 0, 1
    match = LAYER_NAME.fullmatch(name)
    if match and match.group(2) in LAYER_WEIGHTS and int(match.group(1)) < len(model.layers):
        layer = model.layers[int(match.group(1))]
        attr, part, parts = LAYER_WEIGHTS[match.group(2)]
        if _wanted(layer, attr):
            return layer, attr, part, parts
    if IGNORED.search(name):
        return None
    raise ModelLoadError(
        f"Unexpected weight {name!r} for a {model.config.model_type} model; the checkpoint may be a "
        "variant this app does not support."
    )


def _wanted(layer: Any, attr: str) -> bool:
    options = layer.options
    return {
        "qkv_bias": options.qkv_bias,
        "o_bias": options.o_bias,
        "q_norm": options.qk_norm,
        "k_norm": options.qk_norm,
    }.get(attr, True)


def _expected_shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    hidden, inter = c.hidden_size, c.intermediate_size
    return {
        "embed": (c.vocab_size, hidden),
        "lm_head": (c.vocab_size, hidden),
        "norm": (hidden,),
        "attn_norm": (hidden,),
        "mlp_norm": (hidden,),
        "qkv.0": (q, hidden),
        "qkv.1": (kv, hidden),
        "qkv.2": (kv, hidden),
        "qkv_bias.0": (q,),
        "qkv_bias.1": (kv,),
        "qkv_bias.2": (kv,),
        "q_norm": (c.head_dim,),
        "k_norm": (c.head_dim,),
        "o": (hidden, q),
        "o_bias": (hidden,),
        "gate_up.0": (inter, hidden),
        "gate_up.1": (inter, hidden),
        "down": (hidden, inter),
    }


def _missing(model: DecoderLM) -> list[str]:
    names = [n for n in ("embed", "norm") if getattr(model, n) is None]
    for i, layer in enumerate(model.layers):
        for attr in (*LAYER_REQUIRED, *LAYER_OPTIONAL):
            if _wanted(layer, attr) and getattr(layer, attr) is None:
                names.append(f"model.layers.{i}.{attr}")
    return names


def _convert(attr: str, weight: WeightTensor, dtype: mx.Dtype, dense_from_rows: int) -> Weight | Embedding:
    if attr == "embed":
        return to_embedding(weight, dtype, dense_from_rows)
    return to_weight(weight, dtype, dense_from_rows) if len(weight.shape) == 2 else to_dense(weight, dtype)


def _fuse(parts: list[Weight | Embedding]) -> Weight | mx.array | list[Weight]:
    if all(isinstance(p, mx.array) for p in parts):  # biases
        return mx.concatenate(parts)  # type: ignore[arg-type]
    matrices: list[Weight] = parts  # type: ignore[assignment]
    # Parts in different formats (e.g. a Q4_0 q with a Q8_0 v) stay separate matmuls.
    fused = concat_rows(matrices)
    return fused if fused is not None else matrices


def _evaluate(value: Weight | Embedding | list[Weight]) -> None:
    arrays: list[mx.array] = []
    for part in value if isinstance(value, list) else [value]:
        if isinstance(part, QuantizedWeight):
            arrays += [part.packed, part.scales, part.biases]
        else:
            arrays.append(part.wt if isinstance(part, DenseWeight) else part)
    mx.eval(*arrays)
