"""`--speculative auto`: the model's own multi-token-prediction head when its checkpoint ships one
(serving/mtp.py attaches it); else the method picked per model and device at load, from what was measured
(docs/speculative.md, "Default"): n-gram lookup for models of 1B parameters or more on the torch CPU
backend, where it won on copying (1.75-2.02x on Qwen2.5-Coder-1.5B) and did not lose on free writing
(1.00-1.14x); off elsewhere: on SmolLM2-135M free writing lost 6-11%, on CUDA a step with drafts leaves
the captured decode graph, and nothing was measured on MLX.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from localchat.engine.config import EngineConfig
    from localchat.weights.config import ModelConfig

log = logging.getLogger(__name__)

AUTO_MIN_PARAMETERS = 1_000_000_000
# A checkpoint that ships a trained MTP head (Qwen3.5, Qwen3-Next): the head its makers trained to draft
# for it, and the proposer vLLM and SGLang use for these models. Not measured on real weights here
# (docs/speculative.md, "MTP heads").
MTP_REASON = "the checkpoint ships a multi-token-prediction head trained to draft for it"


def approx_parameters(config: ModelConfig) -> int:
    """Weights of a dense decoder from its sizes: attention and MLP per layer, plus the embedding (and
    the output matrix when not tied). Close enough to pick a method (SmolLM2-135M: 134.5M, Qwen2.5-1.5B:
    1.54B); a mixture of experts counts one expert's MLP, as one token's decode reads."""
    h, layers = config.hidden_size, config.num_hidden_layers
    q = config.num_attention_heads * config.head_dim
    kv = config.num_key_value_heads * config.head_dim
    per_layer = 2 * h * q + 2 * h * kv + 3 * h * config.intermediate_size
    embeddings = config.vocab_size * h * (1 if config.tie_word_embeddings else 2)
    return layers * per_layer + embeddings


def choose_auto(num_parameters: int, device_name: str) -> tuple[str, str]:
    """(method, why) for `auto` on a model of `num_parameters` on the runner named `device_name`."""
    size = f"{num_parameters / 1e9:.2f}B parameters"
    if not device_name.startswith("cpu"):
        return "off", f"{size} on {device_name}: only the torch CPU backend has measurements that justify it"
    if num_parameters < AUTO_MIN_PARAMETERS:
        return "off", f"{size} on CPU: n-gram lost 6-11% on free writing for small models (SmolLM2-135M)"
    return "ngram", f"{size} on CPU: n-gram won on copying and did not lose on free writing (1.5B)"


def resolve_auto(
    config: EngineConfig, model: ModelConfig, device_name: str, mtp_head: bool = False
) -> EngineConfig:
    """`config` with `auto` replaced by the method chosen for this model and device (logged, and kept in
    `SpeculativeConfig.auto_reason` for /metrics); any other method unchanged. `mtp_head`: the model's own
    multi-token-prediction head was attached (serving/mtp.py), which `auto` then uses."""
    spec = config.speculative
    if spec.method != "auto":
        return config
    if mtp_head:
        method, why = "mtp", MTP_REASON
    else:
        method, why = choose_auto(approx_parameters(model), device_name)
    log.info("--speculative auto picked %s: %s", method, why)
    return replace(config, speculative=replace(spec, method=method, auto_reason=why))
