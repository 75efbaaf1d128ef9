"""The fused decode step's layer table (csrc/lc_step.h's structs), mirrored field for field in ctypes.

The torch backend's decode_step.py fills one `StepLayer` per decoder layer with tensor addresses, and one
`StepArgs` (every argument of the call) that it hands to `lc_decode_layers` by pointer. The C side
`_Static_assert`s the same sizes.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

MAX_SEGMENTS = 4  # LC_STEP_MAX_SEG: typed row segments per matrix (a fused q|k|v of three types needs 3)
MAX_AUX = 8  # LC_STEP_MAX_AUX: layer inputs one step can copy out (an EAGLE-3 head reads three)

_Seg = ctypes.c_int64 * MAX_SEGMENTS


class StepMatrix(ctypes.Structure):
    """lc_step_matrix: one matrix's typed row segments, as lc_linear takes them."""

    _fields_ = [
        ("nseg", ctypes.c_int32),
        ("types", ctypes.c_int32 * MAX_SEGMENTS),
        ("ptrs", ctypes.c_uint64 * MAX_SEGMENTS),
        ("rows", _Seg),
        ("row_bytes", _Seg),
    ]


class StepLayer(ctypes.Structure):
    """lc_step_layer: addresses of the norm weights and biases (0: none), then the four matrices."""

    _fields_ = [
        ("attn_norm", ctypes.c_uint64),
        ("mlp_norm", ctypes.c_uint64),
        ("qkv_bias", ctypes.c_uint64),
        ("o_bias", ctypes.c_uint64),
        ("qkv", StepMatrix),
        ("o", StepMatrix),
        ("gate_up", StepMatrix),
        ("down", StepMatrix),
    ]


_U64, _I64, _I32, _F32 = ctypes.c_uint64, ctypes.c_int64, ctypes.c_int32, ctypes.c_float


class StepArgs(ctypes.Structure):
    """lc_step_args: every argument of lc_decode_layers (addresses as integers; lc_kernels.h says what each
    holds). `aux`/`naux`/`aux_layers`: the inputs of those layers copied out, concatenated per row."""

    _fields_ = [
        *(
            (name, _U64)
            for name in ("layers", "caches", "x", "cos", "sin", "slots", "tables", "seq_lens", "aux")
        ),
        *(
            (name, _I64)
            for name in (
                "num_slots",
                "rows",
                "hidden",
                "heads",
                "kv_heads",
                "d",
                "inter",
                "max_blocks",
                "block_size",
                "window",
            )
        ),
        ("eps", _F32),
        ("scale", _F32),
        *((name, _I32) for name in ("isa", "nlayers", "cache_type", "bf16", "precise", "nth", "naux")),
        ("aux_layers", _I32 * MAX_AUX),
        ("reserved", _I32),
    ]


# csrc/lc_kernels.h _Static_asserts the same sizes: a field added on one side only fails here.
assert ctypes.sizeof(StepMatrix) == 120 and ctypes.sizeof(StepLayer) == 512 and ctypes.sizeof(StepArgs) == 224


def step_matrix(
    types: Sequence[int], ptrs: Sequence[int], rows: Sequence[int], row_bytes: Sequence[int]
) -> StepMatrix:
    """One matrix's segments (at most MAX_SEGMENTS), the unused slots zero."""
    pad = [0] * (MAX_SEGMENTS - len(types))
    return StepMatrix(
        len(types),
        (ctypes.c_int32 * MAX_SEGMENTS)(*types, *pad),
        (ctypes.c_uint64 * MAX_SEGMENTS)(*ptrs, *pad),
        _Seg(*rows, *pad),
        _Seg(*row_bytes, *pad),
    )


def layer_table(layers: Sequence[StepLayer]) -> ctypes.Array[StepLayer]:
    """The C array lc_decode_layers reads."""
    return (StepLayer * len(layers))(*layers)


def cache_table(addresses: Sequence[int]) -> ctypes.Array[ctypes.c_uint64]:
    """Each layer's KV cache address, as lc_decode_layers reads them."""
    return (ctypes.c_uint64 * len(addresses))(*addresses)


def address(array: ctypes.Array[StepLayer] | ctypes.Array[ctypes.c_uint64] | StepArgs) -> int:
    return ctypes.addressof(array)
