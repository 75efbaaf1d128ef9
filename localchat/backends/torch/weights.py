"""Build a model on the meta device and fill it weight by weight, fusing q|k|v and gate|up as parts arrive.

Peak memory stays near the model's size: each weight is converted once and assigned in place of its
meta parameter; fused matrices hold their parts only until the last one arrives.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import replace

import torch
from torch import nn

from localchat.arch.architecture import TOP_WEIGHTS
from localchat.arch.registry import architecture
from localchat.backends.torch.models import model_class
from localchat.backends.torch.models.base import DecoderLM
from localchat.backends.torch.quant import Loaded, QuantPolicy, Weight, convert, finalize, fuse, pack_head
from localchat.errors import ModelLoadError
from localchat.weights.config import ModelConfig
from localchat.weights.experts import split_experts
from localchat.weights.isq_plan import LINEAR_PARAMS
from localchat.weights.tensors import WeightTensor

# Parameters this backend fuses beyond the registry's map: q_norm | k_norm as one [h + kvh, d] table.
TORCH_FUSED = {"q_norm": ("qk_norm", 0, 2), "k_norm": ("qk_norm", 1, 2)}
# Matrices that only ever go through `linear` and so may stay packed (the embedding is indexed by row).
LINEARS = frozenset({*LINEAR_PARAMS, "lm_head"})  # LINEAR_PARAMS: what --isq quantizes (isq_plan.py)
IGNORED = re.compile(r"rotary_emb\.inv_freq$")  # buffers some old checkpoints saved
LAYER_NAME = re.compile(r"model\.layers\.(\d+)\.(.+)")


def load_decoder(
    config: ModelConfig,
    weights: Iterable[WeightTensor],
    device: torch.device,
    dtype: torch.dtype,
    policy: QuantPolicy | None = None,
    prepare: Callable[[DecoderLM], None] | None = None,
) -> DecoderLM:
    """The torch decoder built from a bundle's weights (`weights.loader.load_model` reads the file).
    `prepare`: called on the empty (meta) model before any weight arrives (a pipeline stage drops the
    layers and head it does not hold)."""
    policy = policy or QuantPolicy()
    cls = model_class(config.model_type)
    with torch.device("meta"):
        model = cls(config, device)
    if prepare is not None:
        prepare(model)
    pending: dict[tuple[nn.Module, str], dict[int, Loaded]] = {}
    heads: dict[str, WeightTensor] = {}  # the embedding and LM head as stored (for `_pack_lm_head`)
    arch = architecture(config.model_type)
    stream = arch.sanitize(config, weights) if arch.sanitize else weights  # a family's own layout fixes
    for weight in split_experts(stream):
        target = _target(model, weight.name)
        if target is None:
            continue
        module, pname, part, parts = target
        if pname in arch.float32_params:
            plain = QuantPolicy()
            exact = finalize(convert(weight, torch.float32, device, plain), torch.float32, device, plain)
            _assign(module, pname, exact, weight.name)
            continue
        if pname in ("embed", "lm_head"):
            heads[pname] = weight
        # With our kernels the embedding stays in blocks too (rows are dequantized on lookup).
        keep = pname in LINEARS or (pname == "embed" and policy.kernels is not None)
        rule = policy if keep else QuantPolicy()
        if pname == "embed":  # lookups read GGUF blocks or a dense table, never int4 (nor a dense copy)
            rule = replace(rule, dense_copy=False, block_copies=False, int4=False, isq=False)
        loaded = convert(weight, dtype, device, rule)
        if parts == 1:
            _assign(module, pname, finalize(loaded, dtype, device, rule), weight.name)
            continue
        got = pending.setdefault((module, pname), {})
        got[part] = loaded
        if len(got) == parts:
            del pending[(module, pname)]
            fused = _fuse(pname, [got[i] for i in range(parts)], config)
            _assign(module, pname, finalize(fused, dtype, device, policy), weight.name)
    if isinstance(model.lm_head, nn.Parameter) and model.lm_head.is_meta:
        # Like llama.cpp: a checkpoint without an output matrix reuses the embedding.
        model.lm_head = None
    if policy.int4:
        _pack_lm_head(model, heads, dtype)
    missing = [name for name, p in model.named_parameters() if p.is_meta]
    if missing or pending:
        names = missing or [f"{pname} (partial)" for _, pname in pending]
        raise ModelLoadError(
            f"The checkpoint lacks weights this {config.model_type} model needs: {', '.join(names[:8])}."
        )
    model.after_load()
    return model.eval()


def _pack_lm_head(model: DecoderLM, heads: dict[str, WeightTensor], dtype: torch.dtype) -> None:
    """A dense LM head (or tied embedding) stored as Q8_0 / Q4_0 / Q4_1 also gets a packed form for
    few-row steps (quant.py); the dense table stays for the rest (and for embedding lookups)."""
    tied = model.lm_head is None
    source, dense = heads.get("embed" if tied else "lm_head"), model.embed if tied else model.lm_head
    if source is None or not isinstance(dense, torch.Tensor):
        return
    split = pack_head(source, dense, dtype)
    if split is None:
        return
    if not tied:
        delattr(model, "lm_head")
    object.__setattr__(model, "lm_head", split)


def _target(model: DecoderLM, name: str) -> tuple[nn.Module, str, int, int] | None:
    arch = architecture(model.config.model_type)
    if name in TOP_WEIGHTS or name in arch.top_weights:
        pname = TOP_WEIGHTS.get(name) or arch.top_weights[name]
        if pname == "lm_head" and model.lm_head is None:
            return None  # tied: the embedding serves as the LM head
        return model, pname, 0, 1
    match = LAYER_NAME.fullmatch(name)
    found = arch.layer_weight(match.group(2)) if match else None
    if match and found and int(match.group(1)) < len(model.layers):
        pname, part, parts = TORCH_FUSED.get(found[0], found)
        owner = _submodule(model.layers[int(match.group(1))], pname)
        leaf = pname.rpartition(".")[2]
        if owner is not None and getattr(owner, leaf, None) is not None:
            return owner, leaf, part, parts
    if IGNORED.search(name):
        return None
    raise ModelLoadError(
        f"Unexpected weight {name!r} for a {model.config.model_type} model; the checkpoint may be a "
        "variant this app does not support."
    )


def _submodule(layer: nn.Module, pname: str) -> nn.Module | None:
    """The module holding a dotted parameter path (`moe.experts.3.gate_up`), None if the layer has none."""
    owner = layer
    for step in pname.split(".")[:-1]:
        child = getattr(owner, step, None)  # a ModuleList's children are attributes "0", "1", ...
        if not isinstance(child, nn.Module):
            return None
        owner = child
    return owner


def _fuse(pname: str, parts: list[Loaded], config: ModelConfig) -> Loaded:
    if pname == "qk_norm":  # [head_dim] each -> one row per q head, then one per k head
        q_norm, k_norm = parts
        assert isinstance(q_norm, torch.Tensor) and isinstance(k_norm, torch.Tensor)
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        return torch.cat((q_norm.expand(heads, -1), k_norm.expand(kv_heads, -1)))
    return fuse(parts)


def _assign(module: nn.Module, pname: str, weight: Weight, source: str) -> None:
    current = getattr(module, pname)
    if tuple(current.shape) != tuple(weight.shape):
        raise ModelLoadError(
            f"Weight {source!r} has shape {tuple(weight.shape)}, expected {tuple(current.shape)} from the config."
        )
    if isinstance(weight, torch.Tensor):
        setattr(module, pname, nn.Parameter(weight, requires_grad=False))
        return
    # A packed matrix is no tensor: it replaces the meta parameter as a plain attribute.
    delattr(module, pname)
    object.__setattr__(module, pname, weight)
