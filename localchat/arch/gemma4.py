"""Gemma 4 (text model) facts both backends share: per-layer attention sizes, the two RoPE tables, which
layers reuse another layer's keys and values, and the checkpoint names.

What differs from Gemma 3 (transformers' modeling_gemma4):
- global (`full_attention`) layers may have their own head size (`global_head_dim`) and KV head count
  (`num_global_key_value_heads`, with `attention_k_eq_v`: no v_proj, the values are k_proj's output);
  transformers 5 saves these as `per_layer_config` {layer: overrides};
- q, k get an RMSNorm with a weight, v one without; scores are not scaled (scale 1);
- RMSNorm multiplies by its weight itself (Gemma 2/3: by 1 + weight);
- each layer's output is multiplied by a learned `layer_scalar`;
- the global layers' RoPE is "proportional": the first `partial_rotary_factor` of the frequency pairs turn
  (exponents over the whole head), the others stay still, in rotate-half layout over the whole head;
- the last `num_kv_shared_layers` layers compute no keys or values: each attends over those of the last
  earlier layer of its type.

NOTE: the paged cache holds every layer at the widest head size and the largest KV head count
(`derive_sizes`): narrower layers are zero-padded (zeros add nothing to q.k; the padded value dims are
sliced off) and layers with fewer KV heads repeat them, which keeps every attention path unchanged at the
cost of cache memory. Per-layer embeddings (E2B / E4B: a second token table with a slice per layer, mixed
with a projection of the embedding and added after each layer's MLP) and the MoE block (26B-A4B: a
softmax router over RMS-normed, scaled inputs with per-expert scales, GeGLU experts, its output normed and
added to the dense MLP's) are built.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from localchat.errors import ModelLoadError
from localchat.weights.tensors import WeightTensor

if TYPE_CHECKING:
    from localchat.weights.config import ModelConfig

FULL, SLIDING = "full_attention", "sliding_attention"

# Checkpoint names inside `model.layers.N.`: q, k, v stay separate (global layers may lack v_proj and
# differ in width); q/k norms under names of their own (the torch loader fuses `q_norm`/`k_norm` for
# Qwen3-style layers of one width).
LAYER_WEIGHTS: dict[str, tuple[str, int, int]] = {
    "input_layernorm.weight": ("attn_norm", 0, 1),
    "self_attn.q_proj.weight": ("q", 0, 1),
    "self_attn.k_proj.weight": ("k", 0, 1),
    "self_attn.v_proj.weight": ("v", 0, 1),
    "self_attn.o_proj.weight": ("o", 0, 1),
    "self_attn.q_norm.weight": ("q_weight", 0, 1),
    "self_attn.k_norm.weight": ("k_weight", 0, 1),
    "post_attention_layernorm.weight": ("post_attn_norm", 0, 1),
    "pre_feedforward_layernorm.weight": ("mlp_norm", 0, 1),
    "post_feedforward_layernorm.weight": ("post_mlp_norm", 0, 1),
    "mlp.gate_proj.weight": ("gate_up", 0, 2),
    "mlp.up_proj.weight": ("gate_up", 1, 2),
    "mlp.down_proj.weight": ("down", 0, 1),
    "layer_scalar": ("layer_scalar", 0, 1),
    # Per-layer embeddings (E2B / E4B): each layer's gate, projection and norm.
    "per_layer_input_gate.weight": ("ple_gate", 0, 1),
    "per_layer_projection.weight": ("ple_proj", 0, 1),
    "post_per_layer_input_norm.weight": ("ple_post_norm", 0, 1),
    # The MoE block (26B-A4B), beside the dense MLP: router, stacked experts, three more norms.
    "router.proj.weight": ("moe.router", 0, 1),
    "router.scale": ("moe.router_scale", 0, 1),
    "router.per_expert_scale": ("moe.expert_scale", 0, 1),
    # The stacked experts sit at the layer's top level (`experts.gate_up_proj`); `sanitize` moves them
    # under `moe_block.` so the expert-index pattern (`.experts.N.`) finds their index.
    "moe_block.experts.{e}.gate_up_proj": ("moe.experts.{e}.gate_up", 0, 1),
    "moe_block.experts.{e}.down_proj": ("moe.experts.{e}.down", 0, 1),
    "pre_feedforward_layernorm_2.weight": ("moe.pre_norm", 0, 1),
    "post_feedforward_layernorm_1.weight": ("mlp_post_norm", 0, 1),
    "post_feedforward_layernorm_2.weight": ("moe.post_norm", 0, 1),
    # A GGUF's names for the scalar and the stacked experts carry a `.weight` the checkpoint's lack.
    "layer_scalar.weight": ("layer_scalar", 0, 1),
    "moe_block.experts.{e}.gate_up_proj.weight": ("moe.experts.{e}.gate_up", 0, 1),
    "moe_block.experts.{e}.down_proj.weight": ("moe.experts.{e}.down", 0, 1),
}
# llama.cpp's gemma4 blocks -> names inside `model.layers.N.`. Its converter keeps the norm weights as they
# are (Gemma 4 multiplies by the weight itself) and the q/k rows in the checkpoint's order.
GGUF_BLOCK_NAMES: dict[str, str] = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "layer_output_scale": "layer_scalar",
    "inp_gate": "per_layer_input_gate",
    "proj": "per_layer_projection",
    "post_norm": "post_per_layer_input_norm",
    "ffn_gate_inp": "router.proj",
    "ffn_gate_inp.scale": "router.scale",  # suffix-less tensors: the whole name is the part
    "ffn_down_exps.scale": "router.per_expert_scale",
    "ffn_gate_up_exps": "experts.gate_up_proj",
    "ffn_down_exps": "experts.down_proj",
    "pre_ffw_norm_2": "pre_feedforward_layernorm_2",
    "post_ffw_norm_1": "post_feedforward_layernorm_1",
    "post_ffw_norm_2": "post_feedforward_layernorm_2",
}
# Per-layer embeddings: the token table (all layers side by side) and the projection of the embedding.
TOP_WEIGHTS: dict[str, str] = {
    "model.embed_tokens_per_layer.weight": "ple_embed",
    "model.per_layer_model_projection.weight": "ple_projection",
    "model.per_layer_projection_norm.weight": "ple_norm",
}
# transformers' Gemma4TextConfig defaults for keys a config.json may leave out.
HF_DEFAULTS: dict[str, Any] = {
    "vocab_size": 262_144,
    "head_dim": 256,
    "max_position_embeddings": 131_072,
    "tie_word_embeddings": True,
    "rms_norm_eps": 1e-6,
    "sliding_window": 512,
    "bos_token_id": 2,
    "eos_token_id": 1,
}
EXTRA_KEYS: dict[str, Any] = {
    "layer_types": None,
    "sliding_window_pattern": 6,  # transformers' default when layer_types is absent: 5 sliding, 1 global
    "rope_parameters": None,
    "final_logit_softcapping": None,
    "global_head_dim": None,
    "num_global_key_value_heads": None,
    "attention_k_eq_v": False,
    "per_layer_config": None,
    "num_kv_shared_layers": 0,
    "hidden_size_per_layer_input": 0,
    "vocab_size_per_layer_input": 262_144,
    "enable_moe_block": False,
    "num_experts": None,
    "top_k_experts": None,
    "moe_intermediate_size": None,
    "use_double_wide_mlp": False,
    "use_bidirectional_attention": None,
    "hidden_activation": "gelu_pytorch_tanh",
    "pad_token_id": 0,  # image rows take the pad token's per-layer embeddings (transformers)
}
# Gemma4ForConditionalGeneration's checkpoint: its text LM under model.language_model; the vision and
# audio towers and their embedders are not run.
TEXT_PREFIXES: dict[str, str | None] = {
    "model.language_model.": "model.",
    "lm_head.": "lm_head.",
    "model.vision_tower.": None,
    "model.audio_tower.": None,
    "model.embed_vision.": None,
    "model.embed_audio.": None,
}
_DEFAULT_ROPE = {
    SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
    FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
}


def derive_sizes(config: ModelConfig) -> None:
    """Per-layer head sizes and KV head counts into `extra` (once), the cache's widest ones into the
    config; RoPE settings stay per layer type in `extra["rope_parameters"]`. Idempotent."""
    x = config.extra
    _reject_unbuilt(x)
    if "layer_head_dims" not in x:
        types = x["layer_types"]
        if types and types[-1] != FULL:  # transformers forces the last layer global
            x["layer_types"] = types = [*types[:-1], FULL]
        overrides = _layer_overrides(x, types, config.num_key_value_heads)
        x["layer_head_dims"] = [
            int(overrides.get(i, {}).get("head_dim", config.head_dim)) for i in range(len(types))
        ]
        x["layer_kv_heads"] = [
            int(overrides.get(i, {}).get("num_key_value_heads", config.num_key_value_heads))
            for i in range(len(types))
        ]
        x["rope_parameters"] = {**_DEFAULT_ROPE, **(x.get("rope_parameters") or {})}
    heads = config.num_attention_heads
    kv_max = max(x["layer_kv_heads"])
    if any(heads % kv or kv_max % kv for kv in x["layer_kv_heads"]):
        raise ModelLoadError(
            f"Gemma 4 KV head counts {sorted(set(x['layer_kv_heads']))} do not divide {heads} heads evenly; "
            "the model's config is damaged."
        )
    if x.get("enable_moe_block"):  # MoeSpec's name for it (memory estimates)
        x["num_experts_per_tok"] = x.get("top_k_experts")
    config.head_dim = max(x["layer_head_dims"])
    config.num_key_value_heads = kv_max
    config.partial_rotary_factor = 1.0
    config.rope_scaling = None  # the tables come from rope_parameters, per layer type (`inv_freq`)


def _reject_unbuilt(x: dict[str, Any]) -> None:
    missing = [
        name
        for name, on in (("bidirectional attention", x.get("use_bidirectional_attention") == "all"),)
        if on
    ]
    if missing:
        raise ModelLoadError(
            f"This Gemma 4 checkpoint uses {', '.join(missing)}, which localchat does not run yet; the dense "
            "Gemma 4 text models load.",
            code="unsupported_architecture",
        )


def _layer_overrides(x: dict[str, Any], types: list[str], kv_heads: int) -> dict[int, dict[str, Any]]:
    """transformers 5's `per_layer_config` {layer index: overrides}, or the same built from
    `global_head_dim` / `num_global_key_value_heads` (older config.json files) for the global layers."""
    given = x.get("per_layer_config")
    if isinstance(given, dict) and given:
        return {int(k): dict(v) for k, v in given.items()}
    full: dict[str, Any] = {}
    if x.get("global_head_dim"):
        full["head_dim"] = int(x["global_head_dim"])
    if x.get("attention_k_eq_v") and x.get("num_global_key_value_heads"):
        full["num_key_value_heads"] = int(x["num_global_key_value_heads"])
    return {i: full for i, kind in enumerate(types) if kind == FULL}


def sanitize(config: ModelConfig, weights: Iterable[WeightTensor]) -> Iterator[WeightTensor]:
    """`model.layers.N.experts.*` -> `model.layers.N.moe_block.experts.*` (see LAYER_WEIGHTS)."""
    for weight in weights:
        head, sep, tail = weight.name.partition(".experts.")
        if sep and head.startswith("model.layers.") and head.count(".") == 2:
            yield replace(weight, name=f"{head}.moe_block.experts.{tail}")  # an FP8 expert stays compact
        else:
            yield weight


def kv_sources(config: ModelConfig) -> list[int]:
    """For each layer, the layer whose keys and values it attends over (itself, or for the last
    `num_kv_shared_layers` layers the last earlier layer of the same type)."""
    types: list[str] = config.extra["layer_types"]
    shared = int(config.extra.get("num_kv_shared_layers") or 0)
    first = len(types) - shared
    sources = list(range(len(types)))
    for i in range(max(first, 0), len(types)):
        earlier = [j for j in range(first) if types[j] == types[i]]
        if not earlier:
            raise ModelLoadError(
                f"Gemma 4 layer {i} shares the keys and values of an earlier {types[i]} layer, but there is "
                "none; the model's config is damaged."
            )
        sources[i] = earlier[-1]
    return sources


def inv_freq(config: ModelConfig, layer_type: str, head_dim: int) -> np.ndarray:
    """float32 [head_dim / 2] inverse frequencies of a layer type's RoPE (transformers' tables)."""
    params = config.extra["rope_parameters"].get(layer_type) or {}
    kind = params.get("rope_type", "default")
    base, factor = float(params.get("rope_theta", 10_000.0)), float(params.get("factor") or 1.0)
    if kind not in ("default", "proportional", "linear"):
        raise ModelLoadError(
            f"Gemma 4 RoPE type {kind!r} is not supported (default, proportional, linear).",
            code="unsupported_rope",
        )
    turned = head_dim // 2
    if kind == "proportional":
        turned = int(float(params.get("partial_rotary_factor", 1.0)) * head_dim // 2)
    exponents = (np.arange(0, 2 * turned, 2).astype(np.float32) / np.float32(head_dim)).astype(np.float64)
    table = np.zeros(head_dim // 2, dtype=np.float32)
    table[:turned] = np.float32(1.0) / np.power(np.float64(base), exponents).astype(np.float32)
    return (table / np.float32(factor)).astype(np.float32)


def hf_config_from_gguf(
    get: Callable[[str], Any], shapes: dict[str, tuple[int, ...]], values: Callable[[str], Any]
) -> dict[str, Any]:
    """config.json's keys from llama.cpp's gemma4 metadata: layer kinds from the sliding-window flags, the
    global layers' head size and KV heads from the unsuffixed keys (the sliding ones from `*_swa`), the
    double-wide MLP from per-layer widths, keys-as-values from global layers without attn_v, and the
    proportional RoPE's turning share from rope_freqs (1 for a turning pair, 1e30 for a still one)."""
    layers = int(get("block_count"))
    types = [SLIDING if flag else FULL for flag in get("attention.sliding_window_pattern")][:layers]
    kv, ffn = get("attention.head_count_kv"), get("feed_forward_length")
    kv_per_layer = [int(n) for n in kv] if isinstance(kv, list) else [int(kv)] * layers
    ffn_per_layer = [int(n) for n in ffn] if isinstance(ffn, list) else [int(ffn)] * layers
    head_full = int(get("attention.key_length"))
    head_swa = int(get("attention.key_length_swa") or head_full)
    shared = int(get("attention.shared_kv_layers") or 0)
    full = [i for i, kind in enumerate(types) if kind == FULL]
    computing = [i for i in full if i < layers - shared]  # KV-sharing layers store no k or v at all
    k_eq_v = bool(computing) and all(f"blk.{i}.attn_v.weight" not in shapes for i in computing)
    freqs = values("rope_freqs.weight")
    turning = head_full // 2 if freqs is None else int((np.asarray(freqs) < 1e29).sum())
    experts = int(get("expert_count") or 0)
    keys: dict[str, Any] = {
        "vocab_size": shapes["token_embd.weight"][0],
        "hidden_size": int(get("embedding_length")),
        "intermediate_size": ffn_per_layer[0],
        "use_double_wide_mlp": ffn_per_layer != [ffn_per_layer[0]] * layers,
        "num_hidden_layers": layers,
        "num_attention_heads": int(get("attention.head_count")),
        "num_key_value_heads": kv_per_layer[types.index(SLIDING)] if SLIDING in types else kv_per_layer[0],
        "head_dim": head_swa,
        "layer_types": types,
        "per_layer_config": {
            i: {"head_dim": head_full, "num_key_value_heads": kv_per_layer[i]} for i in full
        },
        "attention_k_eq_v": k_eq_v,
        "num_kv_shared_layers": shared,
        "sliding_window": get("attention.sliding_window"),
        "final_logit_softcapping": get("final_logit_softcapping"),
        "rms_norm_eps": float(str(np.float32(get("attention.layer_norm_rms_epsilon") or 1e-6))),
        "max_position_embeddings": int(get("context_length") or HF_DEFAULTS["max_position_embeddings"]),
        "tie_word_embeddings": "output.weight" not in shapes,
        "rope_parameters": {
            SLIDING: {"rope_type": "default", "rope_theta": float(get("rope.freq_base_swa") or 10_000.0)},
            FULL: {
                "rope_type": "proportional",
                "partial_rotary_factor": 2 * turning / head_full,
                "rope_theta": float(get("rope.freq_base") or 1_000_000.0),
            },
        },
        "hidden_size_per_layer_input": int(get("embedding_length_per_layer_input") or 0),
        "enable_moe_block": experts > 0,
    }
    if "per_layer_token_embd.weight" in shapes:
        keys["vocab_size_per_layer_input"] = shapes["per_layer_token_embd.weight"][0]
    if experts:
        keys |= {
            "num_experts": experts,
            "top_k_experts": int(get("expert_used_count")),
            "moe_intermediate_size": int(get("expert_feed_forward_length")),
        }
    return keys
