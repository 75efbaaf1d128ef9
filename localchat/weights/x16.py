"""What a block matrix occupies once loaded: the file's bytes, or the x16 layout's (csrc/lc_x16_layout.h).

On CPUs with AVX2 or AVX-512 VNNI the torch backend repacks Q4_0, Q4_1, Q8_0, Q4_K and Q6_K matrices into panels
of 16 rows (`LOCALCHAT_KERNEL_LAYOUT=auto`): the same bytes per weight, except Q4_K's 148 per 256
values instead of 144, and whole panels (rows rounded up to 16). The pre-load RAM check sizes models with
this rule; it asks the compiled library by name through ctypes, so this module never imports torch.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
from functools import cache

# (values, bytes) per unit of one row in the x16 layout (Q4_K: 4 bytes more than its GGUF block)
X16_TYPES = {"Q4_0": (32, 18), "Q4_1": (32, 20), "Q8_0": (32, 34), "Q4_K": (256, 148), "Q6_K": (256, 210)}
AVX2 = 1  # the library's ISA id (AVX-512 VNNI, 2, implies it)


def x16_active() -> bool:
    """Whether this install repacks block matrices: the layout not turned off, the kernels' ISA left to
    choose (or AVX2 / AVX-512 VNNI by name), and the library built for a CPU that runs AVX2."""
    if os.environ.get("LOCALCHAT_KERNEL_LAYOUT", "auto").strip().lower() == "gguf":
        return False
    if os.environ.get("LOCALCHAT_KERNELS", "auto").strip().lower() not in ("auto", "", "avx2", "avx512vnni"):
        return False
    return _library_runs_avx2()


@cache
def _library_runs_avx2() -> bool:
    spec = importlib.util.find_spec("localchat.backends.torch._lckernels")
    if spec is None or spec.origin is None:
        return False
    try:
        lib = ctypes.CDLL(spec.origin)
    except OSError:
        return False
    lib.lc_isa_supported.argtypes, lib.lc_isa_supported.restype = [ctypes.c_int], ctypes.c_int
    return bool(lib.lc_isa_supported(AVX2))


def loaded_block_bytes(qtype: str, rows: int, cols: int, stored: int) -> int:
    """Bytes of a `[rows, cols]` matrix of `qtype` blocks (`stored` in the file) as the kernels hold it."""
    if qtype not in X16_TYPES or rows <= 0 or cols % X16_TYPES[qtype][0] or not x16_active():
        return stored
    values, size = X16_TYPES[qtype]
    return -(-rows // 16) * 16 * (cols // values) * size
