"""gpt-oss (20B, 120B) on MLX; the torch twin is localchat/backends/torch/models/gpt_oss.py, the checkpoint
layout localchat/arch/gpt_oss.py.

Llama-shaped attention with q/k/v/o biases, a learned sink logit per head in every softmax (SDPA's
`sinks`), a sliding window on the layers `layer_types` names; every MLP is a mixture of clamped-SwiGLU
experts with biases behind a biased router (softmax over the top-k logits).

Experts shipped in MXFP4 stay MXFP4, in MLX's own "mxfp4" quantization (localchat/backends/mlx/mxfp4.py:
the same e2m1 codes and e8m0 scales), run by `mx.gather_qmm`: the hub's `*_blocks` + `*_scales` as they
are (gate/up rows, interleaved in the file, reordered gate first), and llama.cpp's GGUF MXFP4 blocks with
their nibbles reshuffled (gate and up, stored apart, stacked). Other experts load dense, one by one, and
are stacked.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

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
from localchat.backends.mlx.mxfp4 import Mxfp4Stack, from_ggml, gather, stack
from localchat.backends.mlx.quant import linear
from localchat.errors import ModelLoadError
from localchat.weights.config import ModelConfig
from localchat.weights.tensors import WeightTensor

# The hub's MXFP4 experts and llama.cpp's (a GGUF's gate, up and down, stacked, in MXFP4 blocks).
HUB_MXFP4 = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(gate_up|down)_proj_(blocks|scales)")
GGUF_EXPERTS = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(gate|up|down)_proj\.weight")


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
        return gather(x, w, ids, is_sorted) if isinstance(w, Mxfp4Stack) else _gather(x, w, ids, is_sorted)

    def take_mxfp4(self, name: str, codes: np.ndarray, exponents: np.ndarray) -> None:
        """Every expert's `name` matrix packed: codes uint8 [experts, out, in / 32, 16] in MLX's nibble
        order, exponents uint8 [experts, out, in / 32]."""
        out, cols = self.matrix_shapes[name]
        experts, groups = len(self.experts), cols // 32
        if (
            codes.shape != (experts, out, groups, 16)
            or exponents.shape != (experts, out, groups)
            or cols % 32
        ):
            raise ModelLoadError(
                f"MXFP4 {name} experts {codes.shape[:2]} with {exponents.shape[-1]} scales a row do not "
                f"match the config's {experts} experts of [{out}, {cols}]."
            )
        self.mxfp4[name] = stack(codes, exponents)


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
        """The loader's stream: MXFP4 expert tensors are taken here, packed; the rest goes through the
        family's own rewrite (arch/gpt_oss.py, which would unpack them)."""
        return gpt_oss.sanitize(config, self._take_mxfp4(weights))

    def _take_mxfp4(self, weights: Iterable[WeightTensor]) -> Iterator[WeightTensor]:
        waiting: dict[tuple[int, str], dict[str, WeightTensor]] = {}  # (layer, matrix) -> its pieces
        for weight in weights:
            needs: tuple[str, ...]  # the pieces that make the matrix
            if (hub := HUB_MXFP4.fullmatch(weight.name)) is not None:
                index, name, piece = int(hub[1]), hub[2], hub[3]
                needs = ("blocks", "scales")
            elif (gguf := GGUF_EXPERTS.fullmatch(weight.name)) is not None and weight.dtype == "MXFP4":
                index, piece = int(gguf[1]), gguf[2]
                name, needs = ("down", ("down",)) if piece == "down" else ("gate_up", ("gate", "up"))
            else:
                yield weight
                continue
            if index >= len(self.layers):
                raise ModelLoadError(
                    f"Unexpected weight {weight.name!r}: the config has {len(self.layers)} layers."
                )
            pieces = waiting.setdefault((index, name), {})
            pieces[piece] = weight
            if len(pieces) == len(needs):
                del waiting[(index, name)]
                moe = self.layers[index].moe  # type: ignore[attr-defined]
                assert isinstance(moe, GptOssMoe)
                moe.take_mxfp4(name, *(_hub(name, pieces) if needs[0] == "blocks" else _gguf(pieces, needs)))
        if waiting:
            raise ModelLoadError(f"MXFP4 experts with a part missing: {sorted(waiting)}")


def _hub(name: str, pieces: dict[str, WeightTensor]) -> tuple[np.ndarray, np.ndarray]:
    """The hub's blocks [E, out, G, 16] and scales [E, out, G]; gate_up's rows alternate gate and up."""
    blocks, scales = pieces["blocks"], pieces["scales"]
    codes = np.asarray(blocks.data, dtype=np.uint8).reshape(blocks.shape)
    exponents = np.asarray(scales.data, dtype=np.uint8).reshape(scales.shape)
    if name == "gate_up":  # gate rows first, then up rows
        codes = np.concatenate([codes[:, 0::2], codes[:, 1::2]], axis=1)
        exponents = np.concatenate([exponents[:, 0::2], exponents[:, 1::2]], axis=1)
    return codes, exponents


def _gguf(pieces: dict[str, WeightTensor], order: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """A GGUF's stacked [E, out, in] MXFP4 tensors (gate and up apart) -> one matrix, rows in `order`."""
    parts = [from_ggml(pieces[p].data, pieces[p].shape[0], pieces[p].shape[1]) for p in order]
    if len(parts) == 1:
        return parts[0]
    return np.concatenate([c for c, _ in parts], axis=1), np.concatenate([e for _, e in parts], axis=1)
