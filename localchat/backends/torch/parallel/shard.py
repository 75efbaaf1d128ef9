"""One rank's slice of a Llama-layout model, dense or MoE (Megatron-style tensor parallelism).

Per layer: q heads split evenly across ranks; KV heads too, or replicated when there are fewer KV
heads than ranks (each rank keeps the one its q heads read). qkv and gate|up are column-parallel
(each rank computes its own output columns, no communication); o and down are row-parallel (each
rank multiplies its input slice, then one all-reduce sums the partial products). The embedding and
LM head are vocab-parallel: a rank looks up only the ids in its vocab range (the rest read as zero
rows, the all-reduce fills them in) and computes logits for its range (an all-gather joins them).

The checkpoint is cut as it streams in (shard_weights.py: GGUF blocks stay blocks), so a rank never
loads another rank's part. Each rank's paged KV pool holds only its KV heads; block tables, slot
mappings and everything else in a step's batch are the engine's, the same on every rank.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from localchat.arch.registry import architecture
from localchat.backends import RunnerOptions
from localchat.backends.torch.device import pick_device
from localchat.backends.torch.models.base import DecoderLM
from localchat.backends.torch.models.deepseek import DeepseekLayer
from localchat.backends.torch.models.gemma import GemmaLayer
from localchat.backends.torch.models.gemma4 import Gemma4Layer
from localchat.backends.torch.models.lfm2 import Lfm2Layer
from localchat.backends.torch.models.llama import LlamaLayer
from localchat.backends.torch.models.mamba_hybrid import HybridBlock
from localchat.backends.torch.models.qwen3_next import HybridLayer
from localchat.backends.torch.runner import TorchRunner
from localchat.errors import BackendUnavailableError
from localchat.weights.bundle import ModelBundle
from localchat.weights.config import ModelConfig

from .group import ParallelGroup
from .memory import check_device_memory
from .shard_deltanet import ParallelHybridLayer
from .shard_gemma import ParallelGemmaLayer
from .shard_gemma4 import ParallelGemma4Layer, gemma4_bundle
from .shard_lfm2 import ParallelLfm2Layer
from .shard_llama import ParallelLlama, ParallelLlamaLayer
from .shard_mamba import ParallelHybridBlock
from .shard_mla import MLA_FAMILIES, ParallelDeepseekLayer
from .shard_moe import dense_width
from .shard_weights import SANITIZED_BEFORE_CUT, RankSlice, expert_size, shard_weights

# Families whose layers are Llama's forward (attention + an `mlp` block) with these MLPs: dense SwiGLU
# or a sparse MoE whose experts are cut like the dense MLP (every rank holds every expert's slice);
# Gemma 2 / 3, the same weights with Gemma's forward (shard_gemma.py); LFM2, whose short-conv layers
# are cut by channel (shard_lfm2.py).
# Nemotron-H, whose Mamba-2 mixers are cut by SSM group (shard_mamba.py).
# Qwen3.5 / Qwen3-Next, whose DeltaNet layers are cut by key head (shard_deltanet.py); their MoE (Qwen3-Next,
# Qwen3.5-MoE) has its routed and shared experts cut like the dense MLP, the router and the shared
# expert's gate replicated: sigmoid(gate . x) scales each rank's partial sum, so the layer's one
# all-reduce still sums the whole block.
# Gemma 4 (E2B / E4B, and the MoE 26B-A4B whose experts are cut by width): Gemma's layout at each
# layer's own sizes (shard_gemma4.py).
# Phi-3 / Phi-4-mini: Llama's layer on fused qkv_proj / gate_up_proj (shard_weights cuts each part).
# SmolLM3 (NoPE layers), Ministral 3 (a per-token q scale) and Qwen2-VL / Qwen3-VL / Qwen3-VL-MoE
# (M-RoPE, DeepStack rows): Llama's layer under their own step, which acts per head or on the whole
# summed vector; each rank runs its own copy of the vision tower (docs/parallel.md says why).
# DeepSeek-V2 / V3 and Mistral 4: multi-head latent attention cut by head, the latent replicated, the
# MoE as above (shard_mla.py).
SHARDED_FAMILIES = (
    "llama",
    "qwen3",
    "mixtral",
    "qwen3_moe",
    "gemma",
    "lfm2",
    "mamba_hybrid",
    "qwen3_next",
    "gemma4",
    "phi3",
    "smollm3",
    "ministral3",
    "qwen2_vl",
    "qwen3_vl",
    "qwen3_vl_moe",
    # gpt-oss, GLM-4.5 / 4.6, Llama 4: Llama's layer, their MoE cut like Qwen3-MoE's (shard_moe.py).
    "gpt_oss",
    "glm4_moe",
    "llama4",
    *MLA_FAMILIES,
)
# Families whose `sanitize` only reshapes a weight that the rank's cut takes whole rows of (LFM2's
# conv taps) or renames a checkpoint folder's (Granite 4.0-H's stacked experts): run before the cut.
# GLM-4.5's (drops its multi-token-prediction layers) and Llama 4's (reorders q/k rows within each
# head, and a rank's heads are whole; its stacked experts are turned before the cut, shard_moe.py)
# run at load, on the rank's slice.
ROW_SAFE_SANITIZE = (*SANITIZED_BEFORE_CUT, "glm4_moe", "llama4")
# Families whose `sanitize` runs after the cut, at load, on the rank's config: DeepSeek's rotary rows
# are reordered within each head and llama.cpp's split kv_b merged per head, so the rank's heads give
# the rank's heads (a second run would reorder them twice).
SANITIZED_AFTER_CUT = MLA_FAMILIES


def _unsupported(config: ModelConfig, world: int) -> BackendUnavailableError:
    return BackendUnavailableError(
        f"--tensor-parallel-size {world}: only the Llama family (Llama, Mistral, Qwen2, SmolLM2), "
        "Qwen3, Mixtral, Qwen3-MoE, gpt-oss, GLM-4.5 / 4.6, Llama 4, Phi-3, Gemma 2 / 3, "
        "SmolLM3, Ministral 3, Qwen2-VL / Qwen2.5-VL / Qwen3-VL (and MoE), "
        "Gemma 4 (and MoE), LFM2 (and MoE), Nemotron-H, Granite 4.0-H, DeepSeek-V2 / V3, Mistral 4 and Qwen3.5 / "
        f"Qwen3-Next / Qwen3.5-MoE are sharded so far, not this {config.model_type!r}: "
        f"split its layers instead with --pipeline-parallel-size {world} or drop --tensor-parallel-size."
    )


_CLASSES: dict[tuple[type, type], type] = {}


def _parallel_class(cls: type, parallel: type) -> type:
    """`cls` with the tensor-parallel parts mixed in (same fields: instances switch class in place). A
    layer's `AllReduced` goes before the family's layer, so its `reduce_partial` is the one the shared
    forward calls; the vocab-parallel `ParallelLlama` after the family's model, so the family's own
    embed_tokens / logits (Gemma's sqrt(hidden) scale and soft-cap, Granite's multipliers) and a
    pipeline stage's hand-offs wrap the lookup and the gather through super()."""
    if issubclass(cls, parallel):
        return cls
    key = (cls, parallel)
    if key not in _CLASSES:
        bases = (cls, parallel) if issubclass(parallel, ParallelLlama) else (parallel, cls)
        _CLASSES[key] = type(f"Parallel{cls.__name__}", bases, {})
    return _CLASSES[key]


def valid_sizes(config: ModelConfig, most: int = 64) -> list[int]:
    """The tensor-parallel sizes this model's heads, KV heads and MLP width allow."""
    kvh = config.num_key_value_heads
    channels = config.hidden_size if "conv_L_cache" in config.extra else 0  # LFM2's conv channels
    ssm = config.extra.get("ssm") or {}  # Nemotron-H's Mamba-2: a rank keeps whole SSM groups
    groups = int(ssm.get("groups") or 0)
    shared = int(config.extra.get("shared_intermediate_size") or 0)  # Granite 4.0-H's shared MLP
    shared_expert = int(config.extra.get("shared_expert_intermediate_size") or 0)  # Qwen3-Next's
    key_heads = int(config.extra.get("linear_num_key_heads") or 0)  # DeltaNet: whole key heads
    layer_kv = config.extra.get("layer_kv_heads") or []  # Gemma 4: each layer's own KV heads
    return [
        n
        for n in range(1, most + 1)
        if not config.num_attention_heads % n
        and not config.intermediate_size % n
        and not dense_width(config) % n  # Llama 4's dense layers
        and not expert_size(config) % n
        and not channels % n
        and not groups % n
        and not shared % n
        and not shared_expert % n
        and not key_heads % n
        and not (kvh % n and n % kvh)
        and all(not (int(k) % n and n % int(k)) for k in layer_kv)
    ]


def check_supported(config: ModelConfig, world: int) -> None:
    """A clear error, before any weight is read, for what this slice does not shard."""
    arch = architecture(config.model_type)
    own_layout = arch.sanitize is not None and arch.family not in (*ROW_SAFE_SANITIZE, *SANITIZED_AFTER_CUT)
    # Gemma 4's sanitize only moves the MoE block's experts: shard_gemma4 runs it before the cut.
    own_layout = own_layout and arch.family != "gemma4"
    if arch.family not in SHARDED_FAMILIES or own_layout:
        raise _unsupported(config, world)
    h, kvh, inter = config.num_attention_heads, config.num_key_value_heads, config.intermediate_size
    if world not in valid_sizes(config, world):
        sizes = ", ".join(str(n) for n in valid_sizes(config))
        raise BackendUnavailableError(
            f"--tensor-parallel-size {world} does not split this model: it must divide the attention "
            f"heads ({h}) and the MLP width ({inter}; experts' {expert_size(config)}), and divide or be a "
            f"multiple of the KV heads ({kvh}) (and LFM2's hidden size, its conv channels; Nemotron-H's SSM "
            "groups). "
            f"Sizes that work for it: {sizes}. Or split the layers instead, which needs no "
            f"divisible heads: --pipeline-parallel-size {world}."
        )


def _layer_key(layer: Any) -> Any:
    """What decides a layer's parallel class: its forward, or for the hybrids' layers, which have none
    (their model's loop calls the mixer and the MLP), their class."""
    if isinstance(layer, Lfm2Layer):
        return Lfm2Layer.mlp
    if isinstance(layer, HybridLayer):
        return HybridLayer.linear_attention
    return HybridBlock.relu2_mlp if isinstance(layer, HybridBlock) else type(layer).forward


def sharded_runner(
    bundle: ModelBundle,
    options: RunnerOptions,
    group: ParallelGroup,
    tp_group: Any = None,
    make_runner: Callable[[ModelBundle, RunnerOptions], TorchRunner] = TorchRunner,
) -> TorchRunner:
    """A TorchRunner holding rank `group.rank`'s slice: the checkpoint is cut as it streams in
    (shard_weights.py), so the rank loads, converts and keeps only its part (GGUF blocks included).
    Under TP x PP: `group` is the rank's place in its stage, `tp_group` the stage's ranks, and
    `make_runner` builds the stage's runner."""
    config, world = bundle.config, group.world_size
    check_supported(config, world)
    part = RankSlice.of(config, group)
    check_device_memory(bundle.path, pick_device(options.device), group.rank, world, valid_sizes(config))
    local = replace(
        bundle,
        config=part.local_config(config),
        iter_weights=lambda: shard_weights(bundle.iter_weights(), config, part),
    )
    if architecture(config.model_type).family == "gemma4":  # per-layer head sizes and KV heads
        local = gemma4_bundle(bundle, part)
    runner = make_runner(local, options)
    model = runner.model
    # The parallel classes only sum what the family's forward passes to `reduce_partial`: a family that
    # overrides that forward is not covered.
    parallel: dict[Any, type] = {
        LlamaLayer.forward: ParallelLlamaLayer,
        GemmaLayer.forward: ParallelGemmaLayer,
        Gemma4Layer.forward: ParallelGemma4Layer,
        DeepseekLayer.forward: ParallelDeepseekLayer,  # Mistral 4's layer too
        Lfm2Layer.mlp: ParallelLfm2Layer,  # its model's loop calls the mixer and the MLP, no forward
        HybridBlock.relu2_mlp: ParallelHybridBlock,  # Nemotron-H's blocks: the same
        HybridLayer.linear_attention: ParallelHybridLayer,  # Qwen3.5 / Qwen3-Next's layers: the same
    }
    layer_classes = [parallel[k] for k in map(_layer_key, model.layers) if k in parallel]
    if len(layer_classes) != len(model.layers) or type(model).forward is not DecoderLM.forward:
        raise _unsupported(config, world)
    for layer, layer_class in zip(model.layers, layer_classes, strict=True):
        layer.__class__ = _parallel_class(type(layer), layer_class)  # + the all-reduces
        layer.tp_group = tp_group
    model.__class__ = _parallel_class(type(model), ParallelLlama)  # + the vocab-parallel ends
    assert isinstance(model, ParallelLlama)
    model.vocab_start, model.vocab_rows, model.vocab_size = (
        part.vocab_start,
        part.vocab_rows,
        config.vocab_size,
    )
    model.world_size = world
    model.tp_group = tp_group
    model.fused_decode = None  # the one-call C decode step has no place for the all-reduces
    if runner.device.type != "cuda":
        runner.graph_mode = None  # the CPU path runs eagerly under --tp, as it always did
    # On CUDA each rank captures its decode graphs with the NCCL all-reduces and the logits' all-gather
    # inside (torch does not hand captured collectives to its NCCL watchdog, and current torch runs the
    # watchdog's event queries in thread-local capture mode, so earlier work cannot break a capture): prepare_decode_graphs is forwarded, so every rank captures
    # the same buckets in the same order, and every rank gets the same batch, so all replay the same
    # bucket's graph at each decode step. A --pp stage runner turns graphs off itself (stages.py).
    runner.config = replace(runner.config, vocab_size=config.vocab_size)  # the logits are gathered whole
    return runner
