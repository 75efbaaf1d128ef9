"""A decode step's decoder layers as one call into the compiled kernels (csrc/lc_step.h).

A Llama-layout model whose every projection is a `BlockMatrix` runs a decode-only CPU step's layers in C:
each layer's norm, q|k|v projection, RoPE with the cache write, paged attention, o projection, residual
norm, gate|up, SwiGLU and down projection, the same kernels in the same order as the per-layer Python
path (models/llama.py), so the hidden states match it bit for bit. What goes is the Python between
them: SmolLM2-135M spent about half of each decode token in per-layer tensor allocations and ctypes calls.

A row of several tokens (a speculative step's draft verification, a prompt) runs as one decode row per
token, each over the context up to its own position, as the per-layer path's attention already does on
the kernels (attention.py). Bit for bit in bfloat16 and float32: the C RoPE rounds x2 * sin + x * cos
as the torch RoPE those rows take on the per-layer path does (torch.addcmul: once, an FMA, on the AVX2
and AVX-512 kernels; twice on the portable ones, as torch's default-capability kernel).

Steps of any size up to `MAX_ROWS` tokens run here: batched decode and speculative verification (each
sequence's k drafts and the token before them, k + 1 query rows) past 24 rows too. The per-layer path
runs the same lc_linear on the same block matrices at every row count, so nothing changes but the
Python between the kernels: 2-5 ms a step for SmolLM2-135M, 3-20% of an 8- to 64-row step on one
thread, up to 1.5x on two (docs/speculative.md); at 128-256 rows the two paths tie. Until 2026-11-29
steps of `DENSE_FROM_ROWS` rows or more went layer by layer, because matrices may keep dense copies for
those: a plan whose matrices hold any dense copy (`LOCALCHAT_TORCH_QUANT=copies`, or `auto` on the
portable C kernels) still does.

Steps it does not take run the per-layer path unchanged: more than `MAX_ROWS` tokens (long prompts:
the per-token scratch would stay allocated), rows of several tokens over a cache of another dtype than
the activations or under a sliding window shorter than the step's longest context (the per-layer path
runs those through SDPA: windowed_attention.py), an int8 KV cache, partial rotary, other layer
classes, or `LOCALCHAT_DECODE_STEP=layers` (for comparisons).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
from torch import nn

from localchat.backends.torch.attention import AttentionMetadata
from localchat.backends.torch.cpu import kernels as cpu_kernels
from localchat.backends.torch.cpu.kernels import BlockMatrix, Kernels
from localchat.backends.torch.kv_cache import KVCache
from localchat.backends.torch.quant import DENSE_FROM_ROWS
from localchat.config import backend_choices, backend_variable
from localchat.errors import BackendUnavailableError
from localchat.kernels import library as c_library
from localchat.kernels import step as c_step
from localchat.kernels.step import MAX_AUX, MAX_SEGMENTS, StepArgs, StepLayer, StepMatrix

if TYPE_CHECKING:
    import ctypes

    from localchat.backends.torch.models.llama import LlamaLayer

STEP_ENV = "LOCALCHAT_DECODE_STEP"
STEP_MODES = backend_choices(
    STEP_ENV
)  # fused: one C call where it applies; layers: the per-layer Python path


# The most tokens a fused step takes. Beyond it a step is a prompt's chunk, GEMM-bound either way, and
# lc_decode_layers' intermediates (~8 KiB a row for SmolLM2-135M, ~70 KiB for a 1B model in bfloat16)
# would stay allocated at that size.
MAX_ROWS = 256


def step_mode() -> str:
    return backend_variable(STEP_ENV)


@dataclass(slots=True)
class FusedDecode:
    """One model's layers as lc_decode_layers arguments, built once (the weights never move)."""

    ops: Kernels
    layers: ctypes.Array[StepLayer]
    dtype: torch.dtype  # of the norm weights and biases: the step's activations must match
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    inter: int
    eps: float
    window: int
    keep: list[torch.Tensor]  # the norm and bias tensors whose addresses `layers` holds
    args: StepArgs  # the call's arguments: the model's shape set once, each step's addresses per call
    dense_copies: bool  # some projection keeps a dense copy, which quant.linear uses from DENSE_FROM_ROWS
    caches: tuple[list[KVCache], ctypes.Array[ctypes.c_uint64]] | None = None

    def takes(self, x: torch.Tensor, cos: torch.Tensor, meta: object, kv_caches: list[KVCache]) -> bool:
        """Whether this step runs here: at most MAX_ROWS tokens (fewer than DENSE_FROM_ROWS where a matrix
        keeps a dense copy), the kernels this plan was built for, a float32/bfloat16 cache, full rotary,
        and activations in the weights' dtype. Rows of several
        tokens (draft verification, a short prompt) run as one decode row per token when the cache holds
        their k/v exactly (its dtype is theirs), as the per-layer path runs them (attention.py)."""
        if not isinstance(meta, AttentionMetadata) or step_mode() != "fused":
            return False
        if meta.cpu_kernels is None or meta.cpu_kernels.isa != self.ops.isa:
            return False
        cache = kv_caches[0]
        if not isinstance(cache, torch.Tensor) or cache.dtype not in (torch.float32, torch.bfloat16):
            return False
        if meta.prefills and (cache.dtype != x.dtype or any(row.table is None for row in meta.prefills)):
            return False
        if meta.prefills and self.window and meta.max_seq_len > self.window:
            return False  # the layer path's windowed prefill rows run SDPA (windowed_attention.py)
        rows = x.shape[0]
        return (
            x.dtype == self.dtype
            and rows <= MAX_ROWS
            and (rows < DENSE_FROM_ROWS or not self.dense_copies)
            and cos.shape[-1] == self.head_dim
            and cos.dtype == x.dtype
        )

    def run(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[KVCache],
    ) -> torch.Tensor:
        """x [T, hidden] (the embeddings, updated in place) -> the last layer's output, cos/sin [T, 1, d]."""
        x, cos, sin = x.contiguous(), cos.contiguous(), sin.contiguous()
        rows = x.shape[0]
        cache = kv_caches[0]
        assert isinstance(cache, torch.Tensor)
        tables, lens = token_tables(meta, rows)
        args = self.args
        args.caches = self._cache_args(kv_caches)
        args.cache_type = cpu_kernels.KV_BF16 if cache.dtype == torch.bfloat16 else cpu_kernels.KV_F32
        args.num_slots = cache.shape[2]
        args.x = x.data_ptr()
        args.bf16 = int(x.dtype == torch.bfloat16)
        args.rows = rows
        args.cos = cos.data_ptr()
        args.sin = sin.data_ptr()
        args.slots = meta.slot_mapping.data_ptr()
        args.tables = tables.data_ptr()
        args.max_blocks = tables.shape[1]
        args.seq_lens = lens.data_ptr()
        args.block_size = meta.block_size
        args.precise = int(self.ops.precise)
        args.nth = torch.get_num_threads()
        rc = self.ops.lib.lc_decode_layers(c_step.address(args))
        if rc:
            c_library.check(
                rc,
                f"The CPU kernels rejected a {rows}-row decode step over a cache {tuple(cache.shape)} "
                "(internal error).",
            )
        return x

    def run_keeping(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[KVCache],
        layers: Sequence[int],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`run`, plus the inputs of `layers` (index len(self.layers): the last layer's output) side by
        side per row, [D, len(layers) * hidden], as torch.cat(dim=-1) of them: an EAGLE-3 head's input."""
        if len(layers) > MAX_AUX or not all(0 <= i <= len(self.layers) for i in layers):
            raise BackendUnavailableError(
                f"The fused decode step copies out at most {MAX_AUX} of layers 0..{len(self.layers)}, "
                f"not {list(layers)} (internal error)."
            )
        aux = x.new_empty((x.shape[0], len(layers) * self.hidden))
        args = self.args
        args.aux, args.naux = aux.data_ptr(), len(layers)
        for j, index in enumerate(layers):
            args.aux_layers[j] = index
        try:
            return self.run(x, cos, sin, meta, kv_caches), aux
        finally:
            args.aux, args.naux = 0, 0  # the plain step copies nothing

    def _cache_args(self, kv_caches: list[KVCache]) -> int:
        # The runner replaces its cache list, never edits it: the list object identifies the addresses.
        if self.caches is None or self.caches[0] is not kv_caches:
            addresses = c_step.cache_table([c.data_ptr() for c in kv_caches])  # type: ignore[union-attr]
            if not all(isinstance(c, torch.Tensor) and c.is_contiguous() for c in kv_caches):
                raise BackendUnavailableError(
                    "The fused decode step needs contiguous KV caches (internal error)."
                )
            self.caches = (kv_caches, addresses)
        return c_step.address(self.caches[1])


def token_tables(meta: AttentionMetadata, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's block table [T, blocks] and context length [T]: a decode row's own, and for a row
    of several tokens its table once per token with lengths up to each one's position (causal: this
    step's k/v are in the cache before any query reads it)."""
    if not meta.prefills:
        assert meta.decode_block_tables is not None and meta.decode_lens64 is not None
        return meta.decode_block_tables.view(tokens, -1), meta.decode_lens64
    widths = [row.table.shape[0] for row in meta.prefills if row.table is not None]
    decode = meta.decode_block_tables
    if decode is not None:
        assert meta.decode_lens64 is not None
        decode = decode.view(meta.decode_lens64.shape[0], -1)
        widths.append(decode.shape[1])
    tables = torch.zeros((tokens, max(widths)), dtype=torch.int64)
    lens = torch.empty(tokens, dtype=torch.int64)
    if decode is not None:
        index = meta.decode_token_idx
        assert index is not None and meta.decode_lens64 is not None
        tables[index, : decode.shape[1]] = decode
        lens[index] = meta.decode_lens64
    for row in meta.prefills:
        assert row.table is not None
        queries = row.end - row.start
        tables[row.start : row.end, : row.table.shape[0]] = row.table
        lens[row.start : row.end] = torch.arange(row.seq_len - queries + 1, row.seq_len + 1)
    return tables, lens


def plan(layers: nn.ModuleList, dtype: torch.dtype) -> FusedDecode | None:
    """The fused form of `layers` (norm weights in `dtype`), or None where any layer is not a plain
    LlamaLayer on block matrices of one ISA (subclasses change the layer: q/k norms, scaled queries)."""
    llama = [cast("LlamaLayer", layer) for layer in layers if type(layer).__dict__.get("FUSED_DECODE", False)]
    if not llama or len(llama) != len(layers) or dtype not in (torch.float32, torch.bfloat16):
        return None
    first = llama[0]
    if not isinstance(first.qkv, BlockMatrix):
        return None
    ops, window = first.qkv.ops, _window(first)
    structs: list[StepLayer] = []
    keep: list[torch.Tensor] = []
    dense_copies = False
    for layer in llama:
        options = layer.attn_options
        if options is not None and (
            options.softcap is not None
            or options.scale is not None
            or options.sinks is not None
            or options.pictures_both_ways  # prompts with pictures: not causal (picture_attention.py)
        ):
            return None
        matrices = (layer.qkv, layer.o, layer.gate_up, layer.down)
        blocks = [
            m
            for m in matrices
            if isinstance(m, BlockMatrix) and m.ops is ops and 1 <= len(m.segments) <= MAX_SEGMENTS
        ]
        tensors = (layer.attn_norm, layer.mlp_norm, layer.qkv_bias, layer.o_bias)
        present = [t for t in tensors if t is not None]
        if (
            len(blocks) != 4
            or _window(layer) != window
            or any(t.dtype != dtype or not t.is_contiguous() for t in present)
        ):
            return None
        keep += present
        dense_copies = dense_copies or any(m.dense is not None for m in blocks)
        addresses = (0 if t is None else t.data_ptr() for t in tensors)
        structs.append(StepLayer(*addresses, *(_matrix(m) for m in blocks)))
        hidden, inter = blocks[1].shape[0], blocks[3].shape[1]
    table = c_step.layer_table(structs)
    args = StepArgs(
        layers=c_step.address(table),
        nlayers=len(structs),
        isa=ops.isa,
        hidden=hidden,
        heads=first.heads,
        kv_heads=first.kv_heads,
        d=first.head_dim,
        inter=inter,
        eps=first.eps,
        scale=1 / math.sqrt(first.head_dim),  # the score scale as attention.rope_paged_attention computes it
        window=window,
    )
    return FusedDecode(
        ops=ops,
        layers=table,
        dtype=dtype,
        heads=first.heads,
        kv_heads=first.kv_heads,
        head_dim=first.head_dim,
        hidden=hidden,
        inter=inter,
        eps=first.eps,
        window=window,
        keep=keep,
        args=args,
        dense_copies=dense_copies,
    )


def _window(layer: LlamaLayer) -> int:
    return layer.attn_options.window or 0 if layer.attn_options is not None else 0


def _matrix(matrix: BlockMatrix) -> StepMatrix:
    segments = matrix.segments
    return c_step.step_matrix(
        [s.type_id for s in segments],
        [s.data.data_ptr() for s in segments],
        [s.rows for s in segments],
        [s.row_bytes for s in segments],
    )
