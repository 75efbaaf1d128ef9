"""GGUF block geometry of the types localchat's C kernels read: one table, taken from the gguf package.

`gguf.GGML_QUANT_SIZES` is the reference (values and bytes per block of each GGML type); only a type an
older gguf release lacks (MXFP4 arrived in 0.17; the project accepts 0.10 on) is written out here, and
NVFP4 / Q1_0 / Q2_0 (Q2_0 in no release yet) are registered with gguf by weights/lowbit.py.
"""

from __future__ import annotations

from typing import NamedTuple

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from localchat.weights.lowbit import register_gguf_types


class Block(NamedTuple):
    """One GGUF block type as the kernels see it (csrc/lc_kernels.h's type ids)."""

    type_id: int  # the GGML type id, as in GGUF files
    values: int  # values per block
    size: int  # bytes per block


# Legacy and K-quants: the x16 layout holds them (csrc/lc_x16_layout.h).
X16_TYPES = frozenset({"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"})
# i-quants and ternary types (csrc/lc_iquants.h): read in place, no x16 form.
IQ_TYPES = frozenset(
    {"IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "IQ1_M", "TQ1_0", "TQ2_0"}
)
# gpt-oss's experts (csrc/lc_mxfp4.h) and NVFP4 / Q1_0 / Q2_0 (csrc/lc_lowbit.h): the i-quant kernels
# read them in place too.
OTHER_TYPES = frozenset({"MXFP4", "NVFP4", "Q1_0", "Q2_0"})

_NOT_IN_OLD_GGUF = {"MXFP4": Block(39, 32, 17)}
register_gguf_types()  # NVFP4 / Q1_0 / Q2_0 into gguf's own tables where it lacks them (weights/lowbit.py)


def _block(name: str) -> Block:
    member = GGMLQuantizationType.__members__.get(name)
    if member is None or member not in GGML_QUANT_SIZES:
        return _NOT_IN_OLD_GGUF[name]
    values, size = GGML_QUANT_SIZES[member]
    return Block(int(member), values, size)


# GGUF type name -> its geometry, for every type the kernels run (ordered by type id).
BLOCKS: dict[str, Block] = dict(
    sorted(
        ((name, _block(name)) for name in X16_TYPES | IQ_TYPES | OTHER_TYPES), key=lambda kv: kv[1].type_id
    )
)


def supports(qtype: str, cols: int) -> bool:
    """Whether the kernels read a `qtype` matrix of `cols` columns (rows of whole blocks)."""
    return qtype in BLOCKS and cols % BLOCKS[qtype].values == 0
