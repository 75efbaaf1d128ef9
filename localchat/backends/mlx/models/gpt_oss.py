"""gpt-oss (20B, 120B) on MLX; the torch twin is localchat/backends/torch/models/gpt_oss.py, the checkpoint
layout localchat/arch/gpt_oss.py.

Llama-shaped attention with q/k/v/o biases, a learned sink logit per head in every softmax (SDPA's
`sinks`), a sliding window on the layers `layer_types` names; every MLP is a mixture of clamped-SwiGLU
experts with biases behind a biased router (softmax over the top-k logits).

Experts shipped in MXFP4 (the hub's `*_blocks` + e8m0 `*_scales`) stay MXFP4: MLX's "mxfp4" quantization
is the same format (e2m1 codes, low nibble first, one power-of-two scale per 32 inputs), so the blocks,
viewed as uint32 words, and the scales go to `mx.gather_qmm` as they are (bit-exact with the arch
module's dequantizer, tests/backends/test_mlx_gpt_oss.py). Only the gate/up rows, interleaved in the
file, are reordered (gate rows first). Other checkpoints' experts load dense, one by one, and are stacked.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from localchat.arch import gpt_oss
from localchat.arch.moe import MoeSpec
from localchat.backends.mlx.attention import AttentionMetadata, LayerCache, paged_attention
from localchat.backends.mlx.layers import Rotary, project
from localchat.backends.mlx.models.base import DecoderLM
from localchat.backends.mlx.models.llama import LlamaLayer
from localchat.backends.mlx.models.moe import (
    SORT_FROM_PAIRS,
    Expert,
    SparseMoe,
    Stacked,
    WithMoe,
    _arrays,
    _gather,
    _parts,
    _stack,
)
from localchat.backends.mlx.quant import linear
from localchat.errors import ModelLoadError
from localchat.weights.config import ModelConfig
from localchat.weights.tensors import WeightTensor

MXFP4_TENSOR = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(gate_up|down)_proj_(blocks|scales)")
MXFP4_GROUP = 32  # inputs per e8m0 scale


@dataclass(slots=True)
class Mxfp4Stack:
    """Every expert's matrix [out, in] in MLX's mxfp4 layout."""

    packed: mx.array  # uint32 [experts, out, in / 8]: 8 e2m1 codes per word, low nibble first
    scales: mx.array  # uint8 [experts, out, in / 32]: e8m0 exponents


class GptOssExpert(Expert):
    def __init__(self, hidden: int, size: int) -> None:
        super().__init__(hidden, size)
        self.gate_up_bias: mx.array | None = None
        self.down_bias: mx.array | None = None
        self.declare("gate_up_bias.0", size)
        self.declare("gate_up_bias.1", size)
        self.declare("down_bias", hidden)


class GptOssMoe(SparseMoe):
    def __init__(self, config: ModelConfig) -> None:
        spec = MoeSpec.from_config(config)
        hidden = config.hidden_size
        super().__init__(spec, hidden)
        self.experts = [GptOssExpert(hidden, spec.expert_size) for _ in range(spec.experts)]
        self.matrix_shapes = {"gate_up": (2 * spec.expert_size, hidden), "down": (hidden, spec.expert_size)}
        self.limit = float(config.extra.get("swiglu_limit", 7.0))
        self.alpha = float(config.extra.get("swiglu_alpha", 1.702))
        self.router_bias: mx.array | None = None
        self.declare("router_bias", spec.experts)
        self.mxfp4: dict[str, Mxfp4Stack] = {}  # "gate_up" / "down" taken from the checkpoint as they are
        self.matrices: dict[str, Stacked | Mxfp4Stack] = {}  # set by finish()
        self.gate_up_bias: mx.array | None = None  # [experts, 2 * size], stacked by finish()
        self.down_bias: mx.array | None = None

    def missing(self) -> list[str]:
        return [name for name in super().missing() if name.rpartition(".")[2] not in self.mxfp4]

    def finish(self) -> None:
        for name in ("gate_up", "down"):
            self.matrices[name] = self.mxfp4.get(name) or _stack(
                [_parts(getattr(e, name)) for e in self.experts]
            )
        experts = [e for e in self.experts if isinstance(e, GptOssExpert)]
        self.gate_up_bias = mx.stack([e.gate_up_bias for e in experts if e.gate_up_bias is not None])
        self.down_bias = mx.stack([e.down_bias for e in experts if e.down_bias is not None])
        arrays = [a for m in self.matrices.values() for a in _stacked_arrays(m)]
        mx.eval(*arrays, self.gate_up_bias, self.down_bias)
        self.experts, self.mxfp4 = [], {}  # the stacked copies replace them

    def route(self, x: mx.array) -> tuple[mx.array, mx.array]:
        """x [T, hidden] -> (weights float32 [T, k]: softmax over the k largest logits, expert ids [T, k])."""
        assert self.router is not None
        logits = linear(x, self.router, self.router_bias).astype(mx.float32)
        ids = mx.argpartition(-logits, kth=self.top_k - 1, axis=-1)[:, : self.top_k]
        return mx.softmax(mx.take_along_axis(logits, ids, axis=-1), axis=-1), ids

    def forward(self, x: mx.array) -> mx.array:
        """x [T, hidden] (normed) -> [T, hidden]."""
        assert self.gate_up_bias is not None and self.down_bias is not None
        weights, ids = self.route(x)
        tokens, k = ids.shape
        order = None
        if tokens * k < SORT_FROM_PAIRS:
            rows, chosen = x[:, None, None, :], ids  # [T, 1, 1, hidden], gathered k times
        else:  # pairs sorted by expert: each expert's rows are contiguous for the gathered matmul
            flat = ids.flatten()
            order = mx.argsort(flat)
            rows, chosen = x[order // k][:, None, :], flat[order]  # [T * k, 1, hidden]
        gate_up = self._matmul("gate_up", rows, chosen, order is not None)
        gate, up = mx.split(gate_up + self.gate_up_bias[chosen][..., None, :], 2, axis=-1)
        gate = mx.minimum(gate, self.limit)
        up = mx.clip(up, -self.limit, self.limit)
        act = (up + 1.0) * gate * mx.sigmoid(gate * self.alpha)
        out = self._matmul("down", act, chosen, order is not None) + self.down_bias[chosen][..., None, :]
        # back to [T, k, hidden]
        out = out[:, :, 0, :] if order is None else out[:, 0, :][mx.argsort(order)].reshape(tokens, k, -1)
        return (out * weights.astype(x.dtype)[..., None]).sum(axis=1)

    def _matmul(self, name: str, x: mx.array, ids: mx.array, is_sorted: bool) -> mx.array:
        w = self.matrices[name]
        if not isinstance(w, Mxfp4Stack):
            return _gather(x, w, ids, is_sorted)
        return mx.gather_qmm(
            x,
            w.packed,
            w.scales,
            None,
            rhs_indices=ids,
            transpose=True,
            group_size=MXFP4_GROUP,
            bits=4,
            mode="mxfp4",
            sorted_indices=is_sorted,
        )

    def take_mxfp4(self, name: str, blocks: WeightTensor, scales: WeightTensor) -> None:
        """A checkpoint's stacked MXFP4 matrix: blocks uint8 [experts, out, in / 32, 16], scales uint8
        [experts, out, in / 32]; gate_up's rows alternate gate and up (reordered: gate rows first)."""
        assert sys.byteorder == "little", "the uint32 view below assumes little-endian words"
        out, cols = self.matrix_shapes[name]
        groups = cols // MXFP4_GROUP
        experts = len(self.experts)
        if (
            tuple(blocks.shape) != (experts, out, groups, MXFP4_GROUP // 2)
            or tuple(scales.shape) != (experts, out, groups)
            or cols % MXFP4_GROUP
        ):
            raise ModelLoadError(
                f"MXFP4 {name} blocks {tuple(blocks.shape)} / scales {tuple(scales.shape)} do not match the "
                f"config's {experts} experts of [{out}, {cols}]."
            )
        codes = np.asarray(blocks.data, dtype=np.uint8).reshape(blocks.shape)
        exps = np.asarray(scales.data, dtype=np.uint8).reshape(scales.shape)
        if name == "gate_up":
            codes = np.concatenate([codes[:, 0::2], codes[:, 1::2]], axis=1)
            exps = np.concatenate([exps[:, 0::2], exps[:, 1::2]], axis=1)
        words = np.ascontiguousarray(codes).reshape(experts, out, -1).view(np.uint32)
        stack = Mxfp4Stack(mx.array(words), mx.array(np.ascontiguousarray(exps)))
        mx.eval(stack.packed, stack.scales)
        self.mxfp4[name] = stack


def _stacked_arrays(weight: Stacked | Mxfp4Stack) -> list[mx.array]:
    return [weight.packed, weight.scales] if isinstance(weight, Mxfp4Stack) else _arrays(weight)


class GptOssLayer(WithMoe, LlamaLayer):
    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__(config, index)
        for key in ("gate_up.0", "gate_up.1", "down"):  # every layer is sparse
            del self.shapes[key]
        self.moe = GptOssMoe(config)
        self.sinks: mx.array | None = None  # [heads]
        self.declare("sinks", config.num_attention_heads)
        kinds = config.extra.get("layer_types") or []
        if kinds:
            slides = index < len(kinds) and kinds[index] == "sliding_attention"
        else:  # transformers' default: every `sliding_window_pattern`-th layer attends fully
            slides = (index + 1) % int(config.extra.get("sliding_window_pattern") or 2) != 0
        self.window = config.sliding_window if slides else None

    def __call__(
        self,
        x: mx.array,
        rotary: Rotary,
        positions: mx.array,
        meta: AttentionMetadata,
        cache: LayerCache,
        q_scale: mx.array | None = None,
    ) -> mx.array:
        """Llama's layer with the sinks passed to attention."""
        tokens = x.shape[0]
        h, kvh, d = self.heads, self.kv_heads, self.head_dim
        normed = mx.fast.rms_norm(x, self.attn_norm, self.eps)
        qkv = project(normed, self.qkv, self.qkv_bias).reshape(tokens, h + 2 * kvh, d)
        q, k = rotary(qkv[:, :h], positions), rotary(qkv[:, h : h + kvh], positions)
        attn = paged_attention(
            q, k, qkv[:, h + kvh :], cache, meta, self.scale, self.window, sinks=self.sinks
        )
        assert self.o is not None
        x = x + linear(attn.reshape(tokens, h * d), self.o, self.o_bias)
        return x + self.mlp(mx.fast.rms_norm(x, self.mlp_norm, self.eps))

    def mlp(self, x: mx.array) -> mx.array:
        assert isinstance(self.moe, GptOssMoe)
        return self.moe.forward(x)


class Model(DecoderLM):
    layer_class = GptOssLayer

    def sanitize(self, config: ModelConfig, weights: Iterable[WeightTensor]) -> Iterator[WeightTensor]:
        """The loader's stream: MXFP4 expert tensors are taken here, the rest goes through the
        family's own rewrite (arch/gpt_oss.py, which would dequantize them)."""
        return gpt_oss.sanitize(config, self._take_mxfp4(weights))

    def _take_mxfp4(self, weights: Iterable[WeightTensor]) -> Iterator[WeightTensor]:
        halves: dict[tuple[int, str], dict[str, WeightTensor]] = {}  # (layer, matrix) -> blocks, scales
        for weight in weights:
            match = MXFP4_TENSOR.fullmatch(weight.name)
            if match is None:
                yield weight
                continue
            index, name, kind = int(match[1]), match[2], match[3]
            if index >= len(self.layers):
                raise ModelLoadError(
                    f"Unexpected weight {weight.name!r}: the config has {len(self.layers)} layers."
                )
            pair = halves.setdefault((index, name), {})
            pair[kind] = weight
            if len(pair) == 2:
                del halves[(index, name)]
                layer = self.layers[index]
                assert isinstance(layer, GptOssLayer) and isinstance(layer.moe, GptOssMoe)
                layer.moe.take_mxfp4(name, pair["blocks"], pair["scales"])
        if halves:
            raise ModelLoadError(f"MXFP4 tensors without their blocks or scales: {sorted(halves)}")
