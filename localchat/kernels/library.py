"""The one ctypes binding of localchat's compiled CPU kernels (csrc/, built as `localchat._lckernels`).

Every exported function's argument and result types are set here, in the order csrc/lc_kernels.h
declares them: the backends call the returned library and never load it themselves. Tensors cross as
integer addresses (`data_ptr()`, numpy's `.ctypes.data`), so this module needs neither torch nor numpy.
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
from collections.abc import Callable
from functools import cache

from localchat import cpu_features
from localchat.config import backend_variable
from localchat.errors import BackendUnavailableError, InsufficientMemoryError
from localchat.kernels.step import StepArgs

log = logging.getLogger(__name__)

MODULE = "localchat._lckernels"
KERNELS_ENV = "LOCALCHAT_KERNELS"
LAYOUT_ENV = "LOCALCHAT_KERNEL_LAYOUT"
ISAS = cpu_features.KERNEL_ISAS  # index = the library's ISA id (LC_ISA_* in csrc/lc_kernels.h)

# csrc/lc_kernels.h's results
OK, EINVAL, ENOMEM = 0, -1, -2

_I, _P, _L, _F = ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_float

# name -> (argument types, result type), as csrc/lc_kernels.h declares each export
SIGNATURES: dict[str, tuple[list[type], type]] = {
    "lc_isa_supported": ([_I], _I),
    "lc_isa_best": ([], _I),
    "lc_openmp": ([], _I),
    "lc_quantize": ([_I, _P, _I, _L, _L, _L, _P, _P, _P, _I], _I),
    "lc_x16_supported": ([_I, _I, _L], _I),
    "lc_x16_bytes": ([_I, _L, _L], _L),
    "lc_x16_repack": ([_I, _P, _L, _L, _L, _P, _I], _I),
    "lc_matmul": ([_I, _I, _P, _L, _L, _L, _P, _P, _P, _L, _P, _I, _L, _I], _I),
    "lc_linear": ([_I, _P, _I, _L, _L, _I, _P, _P, _P, _P, _I, _P, _I, _L, _I], _I),
    "lc_dequant_rows": ([_I, _P, _L, _L, _P, _L, _P, _I], _I),
    "lc_decode_attention": (
        [_I, _P, _I, _L, _L, _L, _L, _P, _I, _P, _L, _P, _L, _P, _L, _F, _L, _F, _P, _I, _I],
        _I,
    ),
    "lc_rms_norm": ([_I, _P, _P, _I, _L, _L, _P, _F, _P, _I], _I),
    "lc_swiglu": ([_I, _P, _I, _L, _L, _P, _I], _I),
    "lc_decode_rope_attention": (
        [_I, _P, _L, _P, _L, _I, _L, _L, _L, _L, _P, _P, _P, _P, _I, _L, _P, _L, _P, _L, _F, _L, _F, _P, _I],
        _I,
    ),
    "lc_decode_layers": ([_P], _I),  # one lc_step_args (kernels/step.py's StepArgs) by address
    "lc_step_args_bytes": ([], _L),
}


# Exports a build from before them lacks: bound where present (`optional` finds them), so that a stale
# build still loads and its callers take their other path.
OPTIONAL: dict[str, tuple[list[type], type]] = {
    "lc_argmax_rows": ([_P, _I, _L, _L, _P], _I),
}


def bind(path: str) -> ctypes.CDLL:
    """The library at `path` with every export's signature set (OSError if it does not load).
    Benchmarks bind another build the same way to compare it with this one."""
    lib = ctypes.CDLL(path)
    for name, (argtypes, restype) in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, restype
    for name, (argtypes, restype) in OPTIONAL.items():
        if (fn := getattr(lib, name, None)) is not None:
            fn.argtypes, fn.restype = argtypes, restype
    if lib.lc_step_args_bytes() != ctypes.sizeof(StepArgs):  # a build from other sources than this binding
        raise AttributeError(f"{path}: lc_step_args is not the size localchat/kernels/step.py expects")
    return lib


@cache
def library() -> ctypes.CDLL | None:
    """The installed build, None when it was not built (no C compiler at install) or fails to load."""
    spec = importlib.util.find_spec(MODULE)
    if spec is None or spec.origin is None:
        return None
    try:
        return bind(spec.origin)
    except (OSError, AttributeError) as exc:  # AttributeError: a stale build that lacks an export
        log.warning("localchat's CPU kernels failed to load (%s); using the pure-torch path.", exc)
        return None


@cache
def optional(name: str) -> Callable[..., int] | None:
    """An `OPTIONAL` export of the installed build, None without it (not built, or built before it)."""
    lib = library()
    return None if lib is None else getattr(lib, name, None)


def runnable_isas() -> list[str]:
    """The ISAs this CPU runs (empty without the library): what the library finds, narrowed to the
    emulated CPU's under LOCALCHAT_EMULATE_CPU (cpu_features.py)."""
    lib = library()
    if lib is None:
        return []
    return [name for i, name in enumerate(ISAS) if lib.lc_isa_supported(i) and cpu_features.allowed(name)]


def isa_choice() -> str:
    """`LOCALCHAT_KERNELS` as given: auto, off, or one ISA by name."""
    return backend_variable(KERNELS_ENV)


def layout_choice() -> str:
    """`LOCALCHAT_KERNEL_LAYOUT`: `auto` repacks block matrices into the x16 layout where the kernels
    read it (AVX2, AVX-512 VNNI, NEON; every block type), `gguf` keeps the file's blocks as they are."""
    return backend_variable(LAYOUT_ENV)


def kernel_isa() -> str | None:
    """The ISA the kernels would run on (LOCALCHAT_KERNELS, the CPU, LOCALCHAT_EMULATE_CPU), None when
    they are off or not built, or a named ISA cannot run here (loading the torch backend says why)."""
    choice = isa_choice()
    runnable = runnable_isas()
    if choice == "off" or not runnable:
        return None
    name = cpu_features.best_isa(runnable) if choice == "auto" else choice
    return name if name in runnable else None


def x16_active() -> bool:
    """Whether block matrices are repacked into the x16 layout (cpu_features.repacks): the layout not
    turned off, and the kernels' ISA (chosen or named) one with x16 kernels that this CPU runs."""
    return cpu_features.repacks(kernel_isa(), layout_choice())


def segment_args(
    types: list[int], ptrs: list[int], rows: list[int], row_bytes: list[int]
) -> tuple[
    int,
    ctypes.Array[ctypes.c_int],
    ctypes.Array[ctypes.c_uint64],
    ctypes.Array[ctypes.c_int64],
    ctypes.Array[ctypes.c_int64],
]:
    """A matrix's typed row segments as lc_linear's `nseg, types, ptrs, rows, row_bytes` arguments."""
    n = len(types)
    return (
        n,
        (ctypes.c_int * n)(*types),
        (ctypes.c_uint64 * n)(*ptrs),
        (ctypes.c_int64 * n)(*rows),
        (ctypes.c_int64 * n)(*row_bytes),
    )


def check(rc: int, rejected: str) -> None:
    """Raise the typed error for a kernel call's result `rc`: out of memory for its scratch buffers (the call
    wrote nothing) or `rejected`, the message for arguments it refused (a bug on our side)."""
    if rc == OK:
        return
    if rc == ENOMEM:
        raise InsufficientMemoryError(
            "The CPU kernels could not grow their scratch buffers (out of memory). Free some RAM, or run fewer "
            "sequences at once (--max-num-seqs) or a smaller model."
        )
    raise BackendUnavailableError(rejected)
