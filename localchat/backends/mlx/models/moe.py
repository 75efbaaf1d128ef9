"""The sparse mixture-of-experts feed-forward block that Mixtral and Qwen3-MoE layers use (MLX).

router -> softmax -> top-k (renormalised where the spec says) -> each chosen expert's SwiGLU -> the
weighted sum. Experts load one by one like any matrix, then `finish()` stacks them into [experts, ...]
arrays so a step runs `mx.gather_mm` (or `mx.gather_qmm` when every expert kept the same MLX quantized
format): two gathered matmuls for the whole step, no loop over tokens or experts, no host sync. Experts
whose formats differ (e.g. a Q4_0 gate next to a Q8_0 up) are stacked dense, in the compute dtype
(float32 on MLX's CPU, whose gather_mm takes nothing else). Hugging Face FP8 / 8-bit experts arrive as Q8_0
blocks and stack as 8-bit groups of 32 like a GGUF Q8_0 file's (tests/backends/test_mlx_fp8_moe_mla.py).
"""

from __future__ import annotations

import mlx.core as mx

from localchat.arch.moe import MoeSpec
from localchat.backends.mlx.layers import silu
from localchat.backends.mlx.models.base import Layer
from localchat.backends.mlx.models.llama import LlamaLayer
from localchat.backends.mlx.quant import DenseWeight, QuantizedWeight, Weight, linear
from localchat.weights.config import ModelConfig

# From this many (token, expert) pairs they are sorted by expert, so each expert's rows form one block
# for the gathered matmul (as mlx-lm does); MLX's CPU build ran both orders alike (moe_bench.py).
SORT_FROM_PAIRS = 64
# A stacked matrix: DenseWeight.wt [experts, in, out], or QuantizedWeight arrays with a leading expert dim.
Stacked = DenseWeight | QuantizedWeight


class Expert(Layer):
    def __init__(self, hidden: int, size: int) -> None:
        self.shapes = {}
        self.gate_up: Weight | list[Weight] | None = None
        self.down: Weight | None = None
        self.declare("gate_up.0", size, hidden)
        self.declare("gate_up.1", size, hidden)
        self.declare("down", hidden, size)


class SparseMoe(Layer):  # a Layer for its declared-weights bookkeeping; called through `forward`
    def __init__(self, spec: MoeSpec, hidden: int) -> None:
        self.shapes = {}
        self.top_k, self.renormalize = spec.top_k, spec.renormalize
        self.router: Weight | None = None
        self.declare("router", spec.experts, hidden)
        self.experts = [Expert(hidden, spec.expert_size) for _ in range(spec.experts)]
        self.gate_up: Stacked | None = None  # set by finish()
        self.down: Stacked | None = None

    def missing(self) -> list[str]:
        names = super().missing()
        for i, expert in enumerate(self.experts):
            names += [f"experts.{i}.{attr}" for attr in expert.missing()]
        return names

    def finish(self) -> None:
        self.gate_up = _stack([_parts(e.gate_up) for e in self.experts])
        self.down = _stack([_parts(e.down) for e in self.experts])
        mx.eval(*_arrays(self.gate_up), *_arrays(self.down))
        self.experts = []  # the stacked copies replace them

    def route(self, x: mx.array) -> tuple[mx.array, mx.array]:
        """x [T, hidden] -> (weights float32 [T, k], expert ids [T, k] in any order)."""
        assert self.router is not None
        probs = mx.softmax(linear(x, self.router).astype(mx.float32), axis=-1)
        ids = mx.argpartition(-probs, kth=self.top_k - 1, axis=-1)[:, : self.top_k]
        weights = mx.take_along_axis(probs, ids, axis=-1)
        if self.renormalize:
            weights = weights / weights.sum(axis=-1, keepdims=True)
        return weights, ids

    def forward(self, x: mx.array) -> mx.array:
        """x [T, hidden] (normed) -> [T, hidden]."""
        assert self.gate_up is not None and self.down is not None
        weights, ids = self.route(x)
        tokens, k = ids.shape
        if tokens * k < SORT_FROM_PAIRS:
            rows = x[:, None, None, :]  # [T, 1, 1, hidden]: one batch entry per token, gathered k times
            gate, up = mx.split(_gather(rows, self.gate_up, ids), 2, axis=-1)  # [T, k, 1, size] each
            out = _gather(silu(gate) * up, self.down, ids)[:, :, 0, :]  # [T, k, hidden]
        else:  # pairs sorted by expert: each expert's rows are contiguous for the gathered matmul
            flat = ids.flatten()
            order = mx.argsort(flat)
            chosen = flat[order]
            rows = x[order // k][:, None, :]  # [T * k, 1, hidden]
            gate, up = mx.split(_gather(rows, self.gate_up, chosen, True), 2, axis=-1)
            out = _gather(silu(gate) * up, self.down, chosen, True)[:, 0, :]
            out = out[mx.argsort(order)].reshape(tokens, k, -1)  # back to [T, k, hidden]
        return (out * weights.astype(x.dtype)[..., None]).sum(axis=1)


def _gather(x: mx.array, w: Stacked, ids: mx.array, is_sorted: bool = False) -> mx.array:
    if isinstance(w, QuantizedWeight):
        return mx.gather_qmm(
            x,
            w.packed,
            w.scales,
            w.biases,
            rhs_indices=ids,
            transpose=True,
            group_size=w.group_size,
            bits=w.bits,
            sorted_indices=is_sorted,
        )
    if w.wt.dtype == mx.float32 and x.dtype != mx.float32:
        # a CPU stack kept float32 (`_stack`) under bf16 / fp16 activations: through it in float32, back
        y = mx.gather_mm(x.astype(mx.float32), w.wt, rhs_indices=ids, sorted_indices=is_sorted)
        return y.astype(x.dtype)
    return mx.gather_mm(x, w.wt, rhs_indices=ids, sorted_indices=is_sorted)


def _parts(weight: Weight | list[Weight] | None) -> list[Weight]:
    assert weight is not None
    return weight if isinstance(weight, list) else [weight]


def _stack(experts: list[list[Weight]]) -> Stacked:
    """Per-expert matrices (each as its row parts) -> one stacked matrix, quantized where all agree."""
    first = experts[0][0]
    if isinstance(first, QuantizedWeight) and all(
        len(parts) == 1
        and isinstance(parts[0], QuantizedWeight)
        and (parts[0].bits, parts[0].group_size, parts[0].mode) == (first.bits, first.group_size, "affine")
        for parts in experts
    ):
        quantized = [parts[0] for parts in experts if isinstance(parts[0], QuantizedWeight)]
        return QuantizedWeight(
            mx.stack([q.packed for q in quantized]),
            mx.stack([q.scales for q in quantized]),
            mx.stack([q.biases for q in quantized if q.biases is not None]),  # affine: all have them
            first.bits,
            first.group_size,
        )
    dense = mx.stack([mx.concatenate([_dense_t(p) for p in parts], axis=1) for parts in experts])
    if mx.default_device() == mx.cpu:
        # MLX's CPU gather_mm runs float32 only (mlx 0.32: "[GatherMM::eval] Currently only supports
        # float32"): a CPU run in bf16 / fp16 would fail at its first step. Metal takes any float type.
        dense = dense.astype(mx.float32)
    return DenseWeight(dense)


def _dense_t(weight: Weight) -> mx.array:
    """A matrix as dense [in, out] (DenseWeight's layout)."""
    if isinstance(weight, DenseWeight):
        return weight.wt
    dense = weight.dequantized()
    return mx.contiguous(dense.T).astype(dense.dtype)


def _arrays(weight: Stacked | None) -> list[mx.array]:
    if isinstance(weight, QuantizedWeight):
        return [weight.packed, weight.scales, *([] if weight.biases is None else [weight.biases])]
    return [] if weight is None else [weight.wt]


class WithMoe(Layer):
    """A layer owning an optional `moe` (None in dense layers): its weights count and finish with the layer's."""

    moe: SparseMoe | None

    def missing(self) -> list[str]:
        own = super().missing()
        return own if self.moe is None else own + [f"moe.{name}" for name in self.moe.missing()]

    def finish(self) -> None:
        if self.moe is not None:
            self.moe.finish()


class MoeLayer(WithMoe, LlamaLayer):
    """A Llama layer whose MLP is a SparseMoe in the layers the config's MoE spec makes sparse."""

    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__(config, index)
        spec = MoeSpec.from_config(config)
        self.moe = SparseMoe(spec, config.hidden_size) if index in spec.sparse_layers else None
        if self.moe is not None:  # no dense gate_up/down to ask the checkpoint for
            for key in ("gate_up.0", "gate_up.1", "down"):
                del self.shapes[key]

    def mlp(self, x: mx.array) -> mx.array:
        return super().mlp(x) if self.moe is None else self.moe.forward(x)
