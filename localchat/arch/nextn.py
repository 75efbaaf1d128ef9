"""GLM-4.5's (and DeepSeek-V3's layout of) multi-token-prediction layers: `model.layers.{L + i}.*` after
the model's L layers, with `eh_proj`, `enorm`, `hnorm`, `shared_head.norm`, `shared_head.head` and a copy
of `embed_tokens` beside the layer's own tensors. The model's load drops them (families.py
`_drop_mtp_layers`); `--speculative mtp` reads them under the `mtp.*` names Qwen3.5 uses
(backends/torch/mtp_head.py), without torch."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING

from localchat.weights.tensors import WeightTensor

if TYPE_CHECKING:
    from localchat.weights.config import ModelConfig

# Inside a nextn layer: the head's own tensors -> their Qwen3.5-style names after `mtp.`.
NEXTN_OWN = {
    "eh_proj.weight": "fc.weight",
    "enorm.weight": "pre_fc_norm_embedding.weight",
    "hnorm.weight": "pre_fc_norm_hidden.weight",
    "shared_head.norm.weight": "norm.weight",
    "shared_head.head.weight": "lm_head.weight",
    "embed_tokens.weight": "embed_tokens.weight",
}


# llama.cpp's nextn tensors of such a block (`blk.{L}.nextn.*`) -> names inside `model.layers.{L}.` (the
# block's layer tensors have the usual block names); GLM-4.5 GGUFs carry them.
NEXTN_GGUF_BLOCK_NAMES = {
    "nextn.eh_proj": "eh_proj",
    "nextn.enorm": "enorm",
    "nextn.hnorm": "hnorm",
    "nextn.shared_head_norm": "shared_head.norm",
    "nextn.shared_head_head": "shared_head.head",
    "nextn.embed_tokens": "embed_tokens",
}


def mtp_weights(config: ModelConfig, weights: Iterable[WeightTensor]) -> Iterator[WeightTensor]:
    """The nextn layers' tensors as `mtp.*`: the head's own by NEXTN_OWN, the layer's under
    `mtp.layers.{i}.`."""
    first = config.num_hidden_layers
    for w in weights:
        parts = w.name.split(".", 3)
        if parts[:2] != ["model", "layers"] or not parts[2].isdigit() or int(parts[2]) < first:
            continue
        index, rest = int(parts[2]) - first, parts[3]
        own = NEXTN_OWN.get(rest)
        name = f"mtp.{own}" if own and index == 0 else f"mtp.layers.{index}.{rest}"
        if own and index:
            continue  # later nextn layers' copies of the head's tensors: one head is run
        yield replace(w, name=name)
