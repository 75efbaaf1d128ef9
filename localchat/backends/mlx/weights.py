"""Fill a model weight by weight, fusing q|k|v and gate|up as parts arrive (as localchat/backends/torch does).

Each weight is converted and evaluated at once, so peak memory stays near the model's size; fused
matrices hold their parts only until the last one arrives. Quantized GGUF matrices stay quantized
where MLX has a matching format (localchat/backends/mlx/quant.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import mlx.core as mx

from localchat.arch.architecture import TOP_WEIGHTS
from localchat.arch.registry import architecture
from localchat.backends.mlx.models import model_class
from localchat.backends.mlx.models.base import DecoderLM
from localchat.backends.mlx.quant import (
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
from localchat.weights.experts import split_experts
from localchat.weights.tensors import WeightTensor

IGNORED = re.compile(r"(rotary_emb\.inv_freq|\.attn\.masked_bias|\.attn\.bias)$")
LAYER_NAME = re.compile(r"model\.layers\.(\d+)\.(.+)")


def load_decoder(
    config: ModelConfig, weights: Iterable[WeightTensor], dtype: mx.Dtype, dense_from_rows: int = 0
) -> DecoderLM:
    """The MLX decoder built from a bundle's weights (`weights.loader.load_model` reads the file).
    `dense_from_rows`: quantized matrices run as transient dense GEMMs for steps of that many rows."""
    model = model_class(config.model_type)(config)
    top_shapes = {
        "embed": (config.vocab_size, config.hidden_size),
        "lm_head": (config.vocab_size, config.hidden_size),
        "norm": (config.hidden_size,),
    }
    top_shapes |= getattr(model, "top_shapes", {})  # a family's own top-level arrays (Gemma 4's)
    tables = {"embed", *getattr(model, "token_tables", ())}  # looked up by rows, kept [rows, width]
    pending: dict[tuple[int, str], dict[int, Weight | Embedding]] = {}
    arch = architecture(config.model_type)
    # A family's own layout fixes; a model class may take some tensors itself first (gpt-oss's MXFP4).
    sanitize = getattr(model, "sanitize", None) or arch.sanitize
    stream = sanitize(config, weights) if sanitize else weights
    for weight in split_experts(stream):
        target = _target(model, weight.name)
        if target is None:
            continue
        owner, attr, part, parts = target
        key = attr if parts == 1 else f"{attr}.{part}"
        expected = top_shapes[key] if owner is model else _expected_shape(owner, key)
        if tuple(weight.shape) != expected:
            raise ModelLoadError(
                f"Weight {weight.name!r} has shape {tuple(weight.shape)}, expected {expected} from the config."
            )
        value = _convert(
            attr in tables, weight, mx.float32 if attr in arch.float32_params else dtype, dense_from_rows
        )
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
    for layer in model.layers:
        layer.finish()
    model.after_load()
    return model


def _target(model: DecoderLM, name: str) -> tuple[Any, str, int, int] | None:
    top = architecture(model.config.model_type).top_weights  # a family's own names (LFM2's final norm)
    if name in TOP_WEIGHTS or name in top:
        attr = TOP_WEIGHTS.get(name) or top[name]
        if attr == "lm_head" and model.config.tie_word_embeddings:
            return None  # tied: the embedding serves as the LM head
        return model, attr, 0, 1
    match = LAYER_NAME.fullmatch(name)
    found = architecture(model.config.model_type).layer_weight(match.group(2)) if match else None
    if match and found and int(match.group(1)) < len(model.layers):
        path, part, parts = found
        owner = _owner(model.layers[int(match.group(1))], path)
        attr = path.rpartition(".")[2]
        if owner is not None and owner.wants(attr):
            return owner, attr, part, parts
    if IGNORED.search(name):
        return None
    raise ModelLoadError(
        f"Unexpected weight {name!r} for a {model.config.model_type} model; the checkpoint may be a "
        "variant this app does not support."
    )


def _owner(layer: Any, path: str) -> Any:
    """The object holding a dotted attribute path (`moe.experts.3.gate_up`), None if the layer has none."""
    owner = layer
    for step in path.split(".")[:-1]:
        owner = owner[int(step)] if isinstance(owner, list) else getattr(owner, step, None)
        if owner is None:
            return None
    return owner


def _expected_shape(owner: Any, key: str) -> tuple[int, ...]:
    """The declared shape; a matrix declared in parts (gate_up.0, gate_up.1) may also come fused."""
    if key in owner.shapes:
        return tuple(owner.shapes[key])
    parts = [shape for name, shape in owner.shapes.items() if name.split(".")[0] == key]
    return (sum(shape[0] for shape in parts), *parts[0][1:])


def _missing(model: DecoderLM) -> list[str]:
    names = [n for n in ("embed", "norm") if getattr(model, n) is None]
    for i, layer in enumerate(model.layers):
        names += [f"model.layers.{i}.{attr}" for attr in layer.missing()]
    return names


def _convert(table: bool, weight: WeightTensor, dtype: mx.Dtype, dense_from_rows: int) -> Weight | Embedding:
    if table:
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
            arrays += [part.packed, part.scales, *([] if part.biases is None else [part.biases])]
        else:
            arrays.append(part.wt if isinstance(part, DenseWeight) else part)
    mx.eval(*arrays)
