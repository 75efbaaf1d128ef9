"""What a block matrix occupies once loaded: the file's bytes, or the x16 layout's (csrc/lc_x16_layout.h).

On CPUs with AVX2, AVX-512 VNNI or ARM's dot product (NEON) the torch backend repacks every block type
(Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) into panels of 16 rows
(`LOCALCHAT_KERNEL_LAYOUT=auto`): the same bytes per weight, except Q3_K's 114 per 256 values instead of
110, Q4_K's 148 instead of 144 and Q5_K's 180 instead of 176 (their scales spread to bytes), and whole
panels (rows rounded up to 16). The pre-load RAM check sizes models with this rule; it asks the compiled
library (localchat/kernels/), so this module never imports torch.
"""

from __future__ import annotations

from localchat.kernels.blocks import BLOCKS, X16_TYPES
from localchat.kernels.library import kernel_isa, library, x16_active

__all__ = ["kernel_isa", "loaded_block_bytes", "x16_active"]


def loaded_block_bytes(qtype: str, rows: int, cols: int, stored: int, x16: bool | None = None) -> int:
    """Bytes of a `[rows, cols]` matrix of `qtype` blocks (`stored` in the file) as the kernels hold it:
    the library's own size of its x16 form (csrc/lc_x16_layout.h) where it repacks (`x16`; None: as this
    install does), else `stored`."""
    x16 = x16_active() if x16 is None else x16
    lib = library() if qtype in X16_TYPES and rows > 0 and x16 else None
    size = -1 if lib is None else int(lib.lc_x16_bytes(BLOCKS[qtype].type_id, rows, cols))
    return size if size >= 0 else stored  # -1: columns that do not split into its units
