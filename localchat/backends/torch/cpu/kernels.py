"""localchat's compiled CPU kernels (csrc/) on torch tensors: matmul straight from GGUF blocks.

Activations are quantized per 32 values to 8 bits (scale amax / 127, round to nearest even) and
multiplied with the weights' integer codes by integer dot products (AVX-512 VNNI, AVX2, ARM NEON's sdot on
aarch64, or portable C, picked at run time from the CPU's features; `neon` runs the x16 layout's kernel,
csrc/lc_x16_neon.h, the i-quants' csrc/lc_iq_neon.h, and portable C for the rest), so one compact form of
each weight serves 1-row decode steps and many-row prefill steps alike; nothing is dequantized to a dense
copy. The math of every block type is in csrc/lc_decode.h. Tensors cross as `data_ptr()` integers: the
library has a plain C ABI and does not depend on the torch version. localchat/kernels/ binds it
(library.py) and holds the block table.

`LOCALCHAT_KERNELS`: `auto` (the best ISA this CPU runs), `off` (the pure-torch path, as when the
extension is missing), or one ISA by name (`portable`, `avx2`, `avx512vnni`, `neon`) for tests and comparisons.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

import torch

from localchat import cpu_features
from localchat.backends.torch.cpu import hugepages
from localchat.backends.torch.kv_cache import Int8KVCache, KVCache
from localchat.config import backend_choices
from localchat.errors import BackendUnavailableError
from localchat.kernels import library
from localchat.kernels.blocks import BLOCKS, IQ_TYPES, X16_TYPES, supports
from localchat.kernels.library import ISAS, KERNELS_ENV, LAYOUT_ENV, isa_choice, layout_choice, runnable_isas

if TYPE_CHECKING:
    from ctypes import CDLL

__all__ = [
    "BLOCKS", "IQ_TYPES", "ISAS", "KERNELS_ENV", "LAYOUT_ENV", "X16_TYPES", "BlockMatrix", "Kernels", "Segment",
    "isa_choice", "layout_choice", "load", "runnable_isas", "supports",
]  # fmt: skip

log = logging.getLogger(__name__)

X16 = 0x100  # type flag: a segment in the x16 layout (csrc/lc_kernels.h's LC_X16)
# auto: x16 where the ISA has its kernels (AVX2, AVX-512 VNNI, NEON); gguf: as stored
LAYOUTS = backend_choices(LAYOUT_ENV)
# Rows repacked between two releases of their file pages (a multiple of the 16-row panel): small
# enough that a 152k-row head never holds much of its file beside its panels, large enough that the
# repack's threads get whole panels to share.
PACK_CHUNK_ROWS = 4096


@dataclass(slots=True)
class Segment:
    """Consecutive output rows stored in one GGUF block type (fused matrices may mix types).

    `data` is the file's blocks, unchanged (uint8 [rows, bytes_per_row]), or with `packed_rows` set
    the same values repacked into panels of 16 rows (csrc/lc_x16_layout.h; uint8 [panels, bytes]) that
    the AVX2 and AVX-512 VNNI kernels read for every row count."""

    qtype: str
    data: torch.Tensor
    packed_rows: int = 0  # > 0: `data` is in the x16 layout and holds this many rows

    @property
    def rows(self) -> int:
        return self.packed_rows or int(self.data.shape[0])

    @property
    def type_id(self) -> int:
        """The library's type argument: the GGML id, flagged when packed."""
        return BLOCKS[self.qtype][0] | (X16 if self.packed_rows else 0)

    @property
    def row_bytes(self) -> int:
        return 0 if self.packed_rows else int(self.data.shape[1])


@dataclass(slots=True)
class BlockMatrix:
    """A linear's matrix `[out, in]` kept as GGUF blocks, rows split into typed segments."""

    segments: list[Segment]
    cols: int
    ops: Kernels  # the kernels that run it
    dense: torch.Tensor | None = None  # [out, in] compute dtype, for many-row steps when RAM allows
    call_args: tuple[object, ...] | None = None  # the segments as ctypes arrays, built on first use

    @property
    def precise(self) -> bool:
        return self.ops.precise

    def segment_args(self) -> tuple[object, ...]:
        if self.call_args is None:
            self.call_args = library.segment_args(
                [s.type_id for s in self.segments],
                [s.data.data_ptr() for s in self.segments],
                [s.rows for s in self.segments],
                [s.row_bytes for s in self.segments],
            )
        return self.call_args

    @property
    def shape(self) -> tuple[int, int]:
        return (sum(s.rows for s in self.segments), self.cols)

    @property
    def nbytes(self) -> int:
        return sum(s.data.numel() for s in self.segments)


def merge_segments(parts: list[BlockMatrix]) -> list[Segment]:
    """One matrix of all parts' rows; neighbouring segments of one type and layout join (one kernel call):
    packed ones only while the first ends on a whole panel (its last panel would be padded otherwise)."""
    merged: list[Segment] = []
    for seg in (s for p in parts for s in p.segments):
        last = merged[-1] if merged else None
        if last is None or last.qtype != seg.qtype or bool(last.packed_rows) != bool(seg.packed_rows):
            merged.append(seg)
        elif not seg.packed_rows:
            merged[-1] = Segment(seg.qtype, torch.cat((last.data, seg.data)))
        elif last.packed_rows % 16 == 0:
            panels = last.data.shape[0] + seg.data.shape[0]
            out = hugepages.empty(panels * last.data.shape[1]).view(panels, -1)
            torch.cat((last.data, seg.data), out=out)
            merged[-1] = Segment(seg.qtype, out, last.packed_rows + seg.packed_rows)
        else:
            merged.append(seg)
    return merged


class Kernels:
    """The loaded library, bound to one ISA. `precise`: activations at ~15 bits, the 8-bit form plus its
    8-bit residual (lc_linear; twice the integer dot products), for every matrix these kernels run."""

    def __init__(self, lib: CDLL, isa: int, precise: bool = False) -> None:
        self.lib, self.isa, self.precise = lib, isa, precise
        self.name = ISAS[isa]

    def matmul(self, x: torch.Tensor, weight: BlockMatrix) -> torch.Tensor:
        """x [T, in] (bfloat16 or float32) @ weight.T -> [T, out] in x's dtype: one library call that
        quantizes x (into per-thread buffers) and runs every segment (Python overhead counts at 1 row)."""
        if x.dtype not in (torch.bfloat16, torch.float32):
            return self.matmul(x.float(), weight).to(x.dtype)
        x = x.contiguous()
        rows, cols = x.shape
        out_features = weight.shape[0]
        out = torch.empty(rows, out_features, dtype=x.dtype)
        bf16 = int(x.dtype == torch.bfloat16)
        rc = self.lib.lc_linear(
            self.isa, x.data_ptr(), bf16, rows, cols, *weight.segment_args(), int(weight.precise),
            out.data_ptr(), bf16, out_features, torch.get_num_threads(),
        )  # fmt: skip
        if rc:  # format the message only on failure: these calls run per layer
            library.check(rc, f"The CPU kernels rejected a {weight.shape} matmul (internal error).")
        return out

    def dequantize_rows(self, seg: Segment, cols: int, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Rows `ids` of a block matrix as dense values (embedding lookups from a quantized table)."""
        ids = ids.to(torch.int64).contiguous()
        out = torch.empty(
            ids.numel(), cols, dtype=torch.bfloat16 if dtype == torch.bfloat16 else torch.float32
        )
        rc = self.lib.lc_dequant_rows(
            seg.type_id, seg.data.data_ptr(), cols, seg.row_bytes, ids.data_ptr(), ids.numel(),
            out.data_ptr(), int(out.dtype == torch.bfloat16),
        )  # fmt: skip
        if rc:
            library.check(rc, f"The CPU kernels cannot read {seg.qtype} rows of {cols} values.")
        return out.to(dtype)

    def x16_layout(self) -> bool:
        """Whether block matrices on these kernels are repacked into the x16 layout (cpu_features.repacks:
        an ISA with x16 kernels, and the layout setting not `gguf`)."""
        return cpu_features.repacks(self.name, layout_choice())

    def can_repack(self, qtype: str, cols: int) -> bool:
        """Whether this ISA has x16 kernels for `qtype` matrices of `cols` columns."""
        return qtype in BLOCKS and bool(self.lib.lc_x16_supported(self.isa, BLOCKS[qtype][0], cols))

    def repack(self, seg: Segment, cols: int) -> Segment:
        """`seg` in the x16 layout where this ISA has kernels for it (else `seg` itself): the same
        values and results (integer codes and scales copied exactly), read faster at every row count."""
        if seg.packed_rows or not self.can_repack(seg.qtype, cols):
            return seg
        return self.pack_rows(seg.qtype, seg.data.data_ptr(), seg.rows, seg.row_bytes, cols)

    def pack_rows(
        self,
        qtype: str,
        address: int,
        rows: int,
        row_bytes: int,
        cols: int,
        consumed: Callable[[int, int], None] | None = None,
    ) -> Segment:
        """A packed segment from `rows` GGUF rows at `address` (row_bytes apart; e.g. the mapped file,
        so that no private copy of the blocks exists beside the packed one). Check `can_repack` first.
        `consumed(start, end)` is told each run of source rows once packed (the loader drops those file
        pages, so a large matrix never holds its file bytes and its panels at once)."""
        tid = BLOCKS[qtype][0]
        panel = self.lib.lc_x16_bytes(tid, 16, cols)
        data = hugepages.empty((rows + 15) // 16 * panel).view(-1, panel)  # decode streams it: huge pages
        chunk = rows if consumed is None else PACK_CHUNK_ROWS
        for start in range(0, rows, chunk):
            n = min(chunk, rows - start)
            rc = self.lib.lc_x16_repack(
                tid, address + start * row_bytes, n, cols, row_bytes, data[start // 16].data_ptr(),
                torch.get_num_threads(),
            )  # fmt: skip
            if rc:
                library.check(rc, f"The CPU kernels cannot repack {qtype} rows of {cols} values.")
            if consumed is not None:
                consumed(start, start + n)
        return Segment(qtype, data, rows)

    def decode_attention(
        self,
        q: torch.Tensor,
        cache: KVCache,
        tables: torch.Tensor,
        seq_lens: torch.Tensor,
        block_size: int,
        scale: float,
        window: int = 0,
        softcap: float = 0.0,
    ) -> torch.Tensor:
        """One query token per row over the paged cache, read in place (csrc/lc_attention.h):
        q [D, heads, d], cache [2, kv_heads, slots, d], tables int64 [D, max_blocks], seq_lens int64 [D]
        -> [D, heads, d] in q's dtype. window > 0: only the last `window` positions; softcap > 0:
        scores capped to softcap * tanh(score / softcap). q is float32 or bfloat16; the cache float32,
        bfloat16 or int8 codes with scales (read in place, each row dequantized as the kernel reads it)."""
        q, tables, seq_lens = q.contiguous(), tables.contiguous(), seq_lens.contiguous()
        rows, heads, head_dim = q.shape
        out = torch.empty_like(q)
        if isinstance(cache, Int8KVCache):
            data, kind, scales = cache.codes, KV_INT8, cache.scales.data_ptr()
        else:
            data, kind, scales = cache, KV_BF16 if cache.dtype == torch.bfloat16 else KV_F32, None
        rc = self.lib.lc_decode_attention(
            self.isa, q.data_ptr(), int(q.dtype == torch.bfloat16), rows, heads, cache.shape[1], head_dim,
            data.data_ptr(), kind, scales, cache.shape[2], tables.data_ptr(),
            tables.shape[1], seq_lens.data_ptr(), block_size, scale, window, softcap,
            out.data_ptr(), int(out.dtype == torch.bfloat16), torch.get_num_threads(),
        )  # fmt: skip
        if rc:
            library.check(
                rc,
                f"The CPU decode-attention kernel rejected q {tuple(q.shape)} over a cache "
                f"{tuple(cache.shape)} (internal error).",
            )
        return out

    def rms_norm(
        self, x: torch.Tensor, weight: torch.Tensor | None, eps: float, residual: torch.Tensor | None = None
    ) -> torch.Tensor:
        """RMSNorm over the last dim of x (csrc/lc_fused.h), times `weight` if given. With `residual`
        (x's shape and dtype, contiguous) the row normalized is x + residual, written into `residual`."""
        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.shape[-1]
        rc = self.lib.lc_rms_norm(
            self.isa, x.data_ptr(), None if residual is None else residual.data_ptr(),
            int(x.dtype == torch.bfloat16), x.numel() // n, n, None if weight is None else weight.data_ptr(),
            eps, out.data_ptr(), torch.get_num_threads(),
        )  # fmt: skip
        if rc:
            library.check(rc, f"The CPU RMSNorm kernel rejected {tuple(x.shape)} (internal error).")
        return out

    def swiglu(self, gate_up: torch.Tensor) -> torch.Tensor:
        """gate_up [T, 2 * inter] (gate | up) -> silu(gate) * up [T, inter] (csrc/lc_fused.h)."""
        gate_up = gate_up.contiguous()
        rows, inter = gate_up.shape[0], gate_up.shape[1] // 2
        out = torch.empty(rows, inter, dtype=gate_up.dtype)
        rc = self.lib.lc_swiglu(
            self.isa, gate_up.data_ptr(), int(gate_up.dtype == torch.bfloat16), rows, inter, out.data_ptr(),
            torch.get_num_threads(),
        )  # fmt: skip
        if rc:
            library.check(rc, f"The CPU SwiGLU kernel rejected {tuple(gate_up.shape)} (internal error).")
        return out

    def decode_rope_attention(
        self,
        qk: torch.Tensor,
        v: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: torch.Tensor,
        slots: torch.Tensor,
        tables: torch.Tensor,
        seq_lens: torch.Tensor,
        block_size: int,
        scale: float,
        window: int = 0,
        softcap: float = 0.0,
    ) -> torch.Tensor:
        """A decode step's attention from the projections, in one call: RoPE on qk [D, heads + kv_heads, d]
        (before rotation; rows may be strided, heads and dims contiguous) with cos/sin [D, 1, d] as
        layers.Rotary makes them, k and v [D, kv_heads, d] written into a float32 or bfloat16 cache at
        `slots` int64 [D], then `decode_attention` -> [D, heads, d]. All of qk, v, cos, sin in one dtype."""
        rows, kv_heads, head_dim = v.shape
        heads = qk.shape[1] - kv_heads
        out = torch.empty(rows, heads, head_dim, dtype=qk.dtype)
        rc = self.lib.lc_decode_rope_attention(
            self.isa, qk.data_ptr(), qk.stride(0), v.data_ptr(), v.stride(0), int(qk.dtype == torch.bfloat16),
            rows, heads, kv_heads, head_dim, cos.data_ptr(), sin.data_ptr(), slots.data_ptr(), cache.data_ptr(),
            KV_BF16 if cache.dtype == torch.bfloat16 else KV_F32, cache.shape[2], tables.data_ptr(),
            tables.shape[1], seq_lens.data_ptr(), block_size, scale, window, softcap, out.data_ptr(),
            torch.get_num_threads(),
        )  # fmt: skip
        if rc:
            library.check(
                rc,
                f"The CPU decode-attention kernel rejected qk {tuple(qk.shape)} over a cache "
                f"{tuple(cache.shape)} (internal error).",
            )
        return out


KV_F32, KV_BF16, KV_INT8 = 0, 1, 2  # csrc/lc_attention.h's cache element types
ATTENTION_MAX_HEAD_DIM = 256  # csrc/lc_attention.h's stack buffers
ATTENTION_MAX_GROUP = 32  # query heads per KV head


def decode_attention_ok(q: torch.Tensor, cache: KVCache) -> bool:
    """Whether `Kernels.decode_attention` takes these tensors: float32 or bfloat16 q, a float32, bfloat16
    or int8 cache, contiguous, on CPU, and head sizes within the kernel's buffers (else the caller
    keeps the torch path)."""
    ok = (torch.float32, torch.bfloat16)
    heads, kv_heads, head_dim = q.shape[1], cache.shape[1], q.shape[2]
    return (
        q.dtype in ok
        and (isinstance(cache, Int8KVCache) or cache.dtype in ok)
        and cache.is_contiguous()
        and cache.device.type == "cpu"
        and head_dim <= ATTENTION_MAX_HEAD_DIM
        and heads % kv_heads == 0
        and heads // kv_heads <= ATTENTION_MAX_GROUP
    )


def load(isa: str | None = None) -> Kernels | None:
    """The kernels for `isa` (default: from `LOCALCHAT_KERNELS`), None when off or not built."""
    choice = (isa or isa_choice()).strip().lower() or "auto"
    if choice == "off":
        return None
    if choice != "auto" and choice not in ISAS:
        raise BackendUnavailableError(
            f"{KERNELS_ENV}={choice!r} is not a choice; use auto, off or one of {', '.join(ISAS)}."
        )
    lib = library.library()
    if lib is None:
        _log_missing()
        return None
    name = cpu_features.best_isa(runnable_isas()) if choice == "auto" else choice
    if name not in runnable_isas():
        raise BackendUnavailableError(f"This CPU cannot run the {choice} kernels; use {KERNELS_ENV}=auto.")
    return Kernels(lib, ISAS.index(name))


@cache
def _log_missing() -> None:
    log.warning(
        "localchat's CPU kernels are not built (no C compiler when it was installed?); quantized models "
        "run on the slower pure-torch path. Reinstall with a C compiler to build them."
    )
