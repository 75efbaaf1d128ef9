"""Ops the model files compose: RoPE application, RMSNorm, SwiGLU, parameter placeholders.

Weights are fused at load time (q|k|v in one matrix, gate|up in another) so a Llama layer costs four
matmuls. Layers hold bare parameters and call these functional ops: no sub-module dispatch per token.

On CPU with localchat's compiled kernels (kernels.py), RMSNorm (with the residual add before it) and
SwiGLU are one C call each (csrc/lc_fused.h) instead of 3-6 torch ops: at a small model's decode step
the ops' fixed cost, not their arithmetic, is the time. `LOCALCHAT_TORCH_ATTENTION=torch` or
`LOCALCHAT_KERNELS=off` keeps the torch ops (kernel_choice.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from localchat.arch.rope import rope_inv_freq, rope_long_inv_freq
from localchat.backends.torch.cpu import kernels as cpu_kernels
from localchat.backends.torch.kernel_choice import cpu_decode_kernels
from localchat.weights.config import ModelConfig

ROPE_CHUNK = 64  # positions per cached cos/sin table of single-token steps
ROPE_CHUNKS_KEPT = 8  # tables kept (a few sequences decoding one at a time), ~130 KiB at head_dim 128


class Rotary:
    """cos/sin for explicit positions, computed once per step and shared by every layer."""

    def __init__(self, config: ModelConfig, device: torch.device) -> None:
        # Not a module buffer: models are built on the meta device, this must hold real values.
        inv_freq, self.scale = rope_inv_freq(config)
        self.inv_freq = torch.from_numpy(inv_freq).to(device)
        self.long = rope_long_inv_freq(config)  # longrope: the table for contexts past the original length
        # Single-token steps' cos/sin, ROPE_CHUNK positions at a time: (first position, dtype) -> tables.
        self._chunks: dict[tuple[int, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}

    def serve_context(self, max_model_len: int) -> None:
        """longrope: one factor list for the whole served context (localchat/arch/rope.py)."""
        if self.long is not None and max_model_len > self.long[1]:
            self.inv_freq = torch.from_numpy(self.long[0]).to(self.inv_freq.device)
            self._chunks.clear()

    def __call__(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [T, 1, rotary_dim] for `apply_rope` (rotary_dim < head_dim: partial rotary)."""
        if positions.shape == (1,) and positions.device.type == "cpu":
            return self._one(int(positions.item()), dtype)
        return self._tables(positions, dtype)

    def _one(self, position: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """A decode step's row from the tables of its ROPE_CHUNK positions, computed by the same
        elementwise ops as a one-row call, so bit for bit its values (tests/backends/test_rope_chunks.py):
        ~0.08 ms of ten small torch ops a token becomes a slice (NOTE: real Qwen2.5-Coder-1.5B, #34)."""
        row = position % ROPE_CHUNK
        cos, sin = self._chunk(position - row, dtype)
        return cos[row : row + 1], sin[row : row + 1]

    def row_addresses(self, position: int, dtype: torch.dtype) -> tuple[int, int]:
        """The addresses of `_one`'s cos and sin rows (the one-row decode step's C call reads them in place:
        two tensor slices a token fewer, cpu/one_row.py). The tables stay alive until ROPE_CHUNKS_KEPT
        others replace them, after the step that read them."""
        row = position % ROPE_CHUNK
        cos, sin = self._chunk(position - row, dtype)
        offset = row * cos.stride(0) * cos.element_size()
        return cos.data_ptr() + offset, sin.data_ptr() + offset

    def _chunk(self, first: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The cos/sin tables [ROPE_CHUNK, 1, d] of the positions from `first` (contiguous)."""
        tables = self._chunks.get((first, dtype))
        if tables is None:
            if len(self._chunks) >= ROPE_CHUNKS_KEPT:
                self._chunks.clear()
            span = torch.arange(first, first + ROPE_CHUNK, device=self.inv_freq.device)
            tables = self._chunks[first, dtype] = self._tables(span, dtype)
        return tables

    def _tables(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq[None, :]  # [T, d/2]
        cos, sin = freqs.cos(), freqs.sin()
        if self.scale != 1.0:
            cos, sin = cos * self.scale, sin * self.scale
        # rotate-half form: out = x * cos + cat(x2, x1) * cat(-sin, sin); [T, 1, d]
        cos_full = torch.cat((cos, cos), dim=-1)[:, None, :].to(dtype)
        sin_signed = torch.cat((-sin, sin), dim=-1)[:, None, :].to(dtype)
        return cos_full, sin_signed


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, d] -> rotated copy (non-interleaved halves, as Hugging Face checkpoints expect).

    With cos/sin narrower than d (partial rotary, e.g. Phi-4-mini) only the first dims turn; the full
    rotary path stays one fused op.
    """
    rotary = cos.shape[-1]
    if rotary == x.shape[-1]:
        # roll by half swaps the halves: cat(x2, x1) in one op
        return torch.addcmul(x * cos, x.roll(rotary // 2, dims=-1), sin)
    turned = x[..., :rotary]
    return torch.cat(
        (torch.addcmul(turned * cos, turned.roll(rotary // 2, dims=-1), sin), x[..., rotary:]), -1
    )


FUSED_DTYPES = (torch.float32, torch.bfloat16)


def fused_kernels(x: torch.Tensor, weight: torch.Tensor | None = None) -> cpu_kernels.Kernels | None:
    """The compiled kernels when they take x (and `weight`): CPU, float32 or bfloat16, one dtype."""
    if x.dtype not in FUSED_DTYPES or (
        weight is not None and (weight.dtype != x.dtype or not weight.is_contiguous())
    ):
        return None
    return cpu_decode_kernels(x.device)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim of x [..., n] (times `weight` [n] if given).

    NOTE: the torch form is LayerNorm over [x, -x], which has mean 0 and the same mean square as x: on
    CPU that is one fused kernel where F.rms_norm runs ~6 ops (13 vs 7 us per decode row, dev box).
    """
    ops = fused_kernels(x, weight)
    if ops is not None:
        return ops.rms_norm(x, weight, eps)
    n = x.shape[-1]
    normed = F.layer_norm(torch.cat((x, -x), dim=-1), (2 * n,), None, None, eps)[..., :n]
    return normed if weight is None else normed * weight


def add_rms_norm(
    x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + delta, rms_norm(x + delta)): a residual add and the norm after it (one C call on CPU; the
    sum is written into `delta`, which the caller hands over)."""
    ops = fused_kernels(x, weight)
    if ops is not None and delta.dtype == x.dtype and delta.is_contiguous() and delta.shape == x.shape:
        normed = ops.rms_norm(x, weight, eps, residual=delta)
        return delta, normed
    total = x + delta
    return total, rms_norm(total, weight, eps)


def empty_param(*shape: int) -> nn.Parameter:
    # Created on the meta device by the loader; real storage is assigned weight by weight.
    return nn.Parameter(torch.empty(*shape), requires_grad=False)


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """[T, 2 * inter] (gate | up, fused at load) -> silu(gate) * up [T, inter]."""
    ops = fused_kernels(gate_up)
    if ops is not None and gate_up.dim() == 2:
        return ops.swiglu(gate_up)
    inter = gate_up.shape[-1] // 2
    return F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
