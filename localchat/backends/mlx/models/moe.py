"""The sparse mixture-of-experts feed-forward block that Mixtral and Qwen3-MoE layers use (MLX).

router -> softmax -> top-k (renormalised where the spec says) -> each chosen expert's SwiGLU -> the
weighted sum. Experts load one by one like any matrix, then `finish()` stacks them into [experts, ...]
arrays so a step runs `mx.gather_mm` (or `mx.gather_qmm`): two gathered matmuls for the whole step, no
loop over tokens or experts, no host sync.

Experts stay in the MLX form each matrix took at load (quant.to_weight), stacked as they are, so a stack is
exactly as exact as the dense layers are: affine groups of any bits and group size (GGUF Q4_0..Q8_0, the
K-quants, the re-quantized Q6_K / Q3_K / Q2_K / i-quants, TQ1_0 / TQ2_0, Q1_0 / Q2_0; Hugging Face GPTQ /
AWQ / compressed-tensors int4 and FP8 / int8 as Q4_1 / Q4_0 / Q8_0 blocks), "nvfp4" (GGUF NVFP4, Hugging
Face NVFP4 folders) and "mxfp4" (MXFP4 experts of any family). mlx 0.32's gather_qmm takes all of these on
CPU, in float32, bfloat16 and float16. A gate and an up in different forms (a Q4_0 gate beside a Q8_0 up)
stack apart, one gathered matmul each, their outputs side by side (`RowStacks`). Only experts whose forms
differ from one another, or a matrix with no MLX form (an NVFP4 scale byte 0xFF, act-order GPTQ), stack
dense, in the compute dtype (float32 on MLX's CPU, whose gather_mm takes nothing else).
"""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(slots=True)
class RowStacks:
    """A stacked matrix kept as row blocks of different forms (gate | up): each gathered apart, the outputs
    concatenated in order."""

    parts: list[DenseWeight | QuantizedWeight]


# A stacked matrix: DenseWeight.wt [experts, in, out], QuantizedWeight arrays with a leading expert dim,
# or row blocks of those.
Stacked = DenseWeight | QuantizedWeight | RowStacks


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
    if isinstance(w, RowStacks):
        return mx.concatenate([_gather(x, part, ids, is_sorted) for part in w.parts], axis=-1)
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
            mode=w.mode,
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
    """Per-expert matrices (each as its row parts) -> one stacked matrix: quantized where every expert's
    matrix has one MLX form, else row block by row block where each block has one, else dense."""
    whole = _stack_quantized([_whole(parts) for parts in experts])
    if whole is not None:
        return whole
    if len({len(parts) for parts in experts}) == 1 and len(experts[0]) > 1:
        blocks = [[parts[i] for parts in experts] for i in range(len(experts[0]))]
        stacks = [_stack_quantized(block) for block in blocks]
        if any(stack is not None for stack in stacks):
            return RowStacks(
                [
                    s if s is not None else _stack_dense([[_dense_t(m)] for m in b])
                    for s, b in zip(stacks, blocks, strict=True)
                ]
            )
    return _stack_dense([[_dense_t(p) for p in parts] for parts in experts])


def _whole(parts: list[Weight]) -> Weight | None:
    """An expert's row parts as one matrix where they share a form (load already fused those), else None."""
    return parts[0] if len(parts) == 1 else None


def _form(weight: QuantizedWeight) -> tuple[object, ...]:
    """What gather_qmm needs to agree across the stacked matrices."""
    scales, biases = weight.scales.dtype, weight.biases is None
    return (weight.bits, weight.group_size, weight.mode, weight.dtype, scales, biases, weight.shape)


def _stack_quantized(matrices: list[Weight] | list[Weight | None]) -> QuantizedWeight | None:
    """Matrices of one MLX quantized form stacked on a leading expert axis, or None."""
    quantized = [m for m in matrices if isinstance(m, QuantizedWeight)]
    if len(quantized) != len(matrices) or len({_form(q) for q in quantized}) != 1:
        return None
    first = quantized[0]
    return QuantizedWeight(
        mx.stack([q.packed for q in quantized]),
        mx.stack([q.scales for q in quantized]),
        None if first.biases is None else mx.stack([q.biases for q in quantized if q.biases is not None]),
        first.bits,
        first.group_size,
        mode=first.mode,
        dtype=first.dtype,
    )


def _stack_dense(experts: list[list[mx.array]]) -> DenseWeight:
    """Each expert's row parts (dense [in, out] each) side by side, stacked."""
    dense = mx.stack([mx.concatenate(parts, axis=1) for parts in experts])
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
    if isinstance(weight, RowStacks):
        return [a for part in weight.parts for a in _arrays(part)]
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
