"""What a block matrix occupies once loaded: the file's bytes, or the x16 layout's (csrc/lc_x16_layout.h).

On CPUs with AVX2, AVX-512 VNNI or ARM's dot product (NEON) the torch backend repacks every block type
(Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) into panels of 16 rows
(`LOCALCHAT_KERNEL_LAYOUT=auto`): the same bytes per weight, except Q3_K's 114 per 256 values instead of
110, Q4_K's 148 instead of 144 and Q5_K's 180 instead of 176 (their scales spread to bytes), and whole
panels (rows rounded up to 16). The pre-load RAM check sizes models with this rule; it asks the compiled
library by name through ctypes, so this module never imports torch.
"""

from __future__ import annotations

import ctypes
import importlib.util
from functools import cache

from localchat import cpu_features
from localchat.config import backend_variable

# GGML type ids of the types the layout holds (the library's lc_x16_bytes sizes them)
X16_TYPE_IDS = {
    "Q4_0": 2,
    "Q4_1": 3,
    "Q5_0": 6,
    "Q5_1": 7,
    "Q8_0": 8,
    "Q2_K": 10,
    "Q3_K": 11,
    "Q4_K": 12,
    "Q5_K": 13,
    "Q6_K": 14,
}


def kernel_isa() -> str | None:
    """The ISA the torch backend's kernels would run on (as kernels.load decides: LOCALCHAT_KERNELS, the
    CPU, LOCALCHAT_EMULATE_CPU), None when they are off or not built (or a named ISA cannot run here)."""
    choice = backend_variable("LOCALCHAT_KERNELS")
    lib = _library()
    if choice == "off" or lib is None:
        return None
    runnable = [
        name
        for i, name in enumerate(cpu_features.KERNEL_ISAS)
        if lib.lc_isa_supported(i) and cpu_features.allowed(name)
    ]
    name = cpu_features.best_isa(runnable) if choice == "auto" else choice
    return name if name in runnable else None


def x16_active() -> bool:
    """Whether this install repacks block matrices (cpu_features.repacks): the layout not turned off, and
    the kernels' ISA (chosen or named) one with x16 kernels that this CPU runs."""
    layout = backend_variable("LOCALCHAT_KERNEL_LAYOUT")
    return cpu_features.repacks(kernel_isa(), layout)


@cache
def _library() -> ctypes.CDLL | None:
    spec = importlib.util.find_spec("localchat.backends.torch._lckernels")
    if spec is None or spec.origin is None:
        return None
    try:
        lib = ctypes.CDLL(spec.origin)
    except OSError:
        return None
    lib.lc_isa_supported.argtypes, lib.lc_isa_supported.restype = [ctypes.c_int], ctypes.c_int
    lib.lc_x16_bytes.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    lib.lc_x16_bytes.restype = ctypes.c_int64
    return lib


def loaded_block_bytes(qtype: str, rows: int, cols: int, stored: int, x16: bool | None = None) -> int:
    """Bytes of a `[rows, cols]` matrix of `qtype` blocks (`stored` in the file) as the kernels hold it:
    the library's own size of its x16 form (csrc/lc_x16_layout.h) where it repacks (`x16`; None: as this
    install does), else `stored`."""
    x16 = x16_active() if x16 is None else x16
    lib = _library() if qtype in X16_TYPE_IDS and rows > 0 and x16 else None
    size = -1 if lib is None else int(lib.lc_x16_bytes(X16_TYPE_IDS[qtype], rows, cols))
    return size if size >= 0 else stored  # -1: columns that do not split into its units
