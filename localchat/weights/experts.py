"""Stacked expert tensors -> one weight per expert, so backends load experts like any other matrix.

transformers 5 keeps a mixture-of-experts layer's experts as 3-D tensors (`mlp.experts.gate_up_proj`
[experts, 2 * inter, hidden]) and llama.cpp writes them the same way (`ffn_gate_exps` [experts, inter,
hidden]); the hub's safetensors name each expert (`mlp.experts.7.gate_proj.weight`). Splitting the stacked
form yields the per-expert names, which the registry maps. A quantized GGUF tensor arrives as rows of
self-contained blocks, so an expert is a slice of rows: nothing is dequantized or copied here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from localchat.weights.tensors import WeightTensor

# `<prefix>.experts.<leaf>` with no expert index: the stacked form.
_STACKED = re.compile(r"(?P<prefix>.+\.experts)\.(?P<leaf>[A-Za-z_]\w*(?:\.weight)?)")


def split_experts(weights: Iterable[WeightTensor]) -> Iterator[WeightTensor]:
    """Every weight as it comes, except 3-D `...experts.<name>` tensors: one 2-D weight per expert."""
    for weight in weights:
        match = _STACKED.fullmatch(weight.name)
        if match is None or len(weight.shape) != 3:
            yield weight
            continue
        experts, rows, cols = weight.shape
        # Quantized data is [experts * rows, bytes_per_row]; dense data is [experts, rows, cols].
        data = weight.data.reshape(experts, rows, -1)
        for e in range(experts):
            name = f"{match['prefix']}.{e}.{match['leaf']}"
            yield WeightTensor(name=name, shape=(rows, cols), dtype=weight.dtype, data=data[e])
