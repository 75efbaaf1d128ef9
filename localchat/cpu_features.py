"""Every choice that depends on which CPU runs the torch backend, as pure functions of its feature flags.

| CPU | kernels' ISA (`LOCALCHAT_KERNELS=auto`) | x16 layout | compute dtype (`--dtype auto`) |
|---|---|---|---|
| AVX-512 VNNI + BF16 (Sapphire Rapids, Zen 4) | avx512vnni | yes | bfloat16 |
| AVX-512 without VNNI or BF16 (Skylake-X) | avx2 | yes | float32 |
| AVX2 + FMA (most laptops, Zen 2/3) | avx2 | yes | float32 |
| older x86 | portable | no | float32 |
| aarch64 with the dot-product extension | neon | yes | float32 |

`LOCALCHAT_EMULATE_CPU=avx512vnni|avx512|avx2|portable` makes every one of these choices as that CPU
would: the flags this process sees are the host's, narrowed to that CPU's (it can only take features
away; an emulated CPU never runs an instruction the host lacks). Tests use it to cover the CPUs CI does
not run on; torch's own dispatch (ATen's vector width, oneDNN's ISA) reads its variables before the
first import of torch, so `torch_env` gives them for a subprocess. This module never imports torch.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from functools import cache

from localchat.errors import BackendUnavailableError

EMULATE_ENV = "LOCALCHAT_EMULATE_CPU"
# The ISAs of localchat's compiled kernels, in the library's id order (kernels.ISAS).
KERNEL_ISAS = ("portable", "avx2", "avx512vnni", "neon")
# Which `auto` picks when several run: the widest first.
_PREFERENCE = ("neon", "avx512vnni", "avx2", "portable")
# ISAs with kernels for the x16 layout (csrc/lc_x16_avx512.h, lc_x16_avx2.h, lc_x16_neon.h); portable C has none.
X16_ISAS = frozenset({"avx2", "avx512vnni", "neon"})

_AVX2 = frozenset({"avx2", "fma"})
_AVX512 = _AVX2 | {"avx512f", "avx512bw", "avx512vl"}
# The CPUs LOCALCHAT_EMULATE_CPU names, as /proc/cpuinfo spells their flags.
EMULATED: dict[str, frozenset[str]] = {
    "avx512vnni": _AVX512 | {"avx512_vnni", "avx512_bf16"},
    "avx512": _AVX512,
    "avx2": _AVX2,
    "portable": frozenset(),
}
# What torch reads at import for each emulated CPU: ATen's kernels' vector width, oneDNN's and MKL's
# widest ISA.
_TORCH_ENV = {
    "avx512vnni": {},
    "avx512": {
        "ATEN_CPU_CAPABILITY": "avx512",
        "ONEDNN_MAX_CPU_ISA": "AVX512_CORE",
        "MKL_ENABLE_INSTRUCTIONS": "AVX512",
    },
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "portable": {
        "ATEN_CPU_CAPABILITY": "default",
        "ONEDNN_MAX_CPU_ISA": "SSE41",
        "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
    },
}


def runnable_isas(flags: Iterable[str]) -> list[str]:
    """The kernels' ISAs a CPU with these flags runs, in KERNEL_ISAS order (csrc/lc_kernels.c's test)."""
    have = frozenset(flags)
    out = ["portable"]
    if have >= _AVX2:
        out.append("avx2")
        if {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"} <= have:
            out.append("avx512vnni")
    if "asimddp" in have:
        out.append("neon")
    return out


def best_isa(runnable: Iterable[str]) -> str:
    """`LOCALCHAT_KERNELS=auto`'s pick among the ISAs that run."""
    available = set(runnable)
    return next(isa for isa in _PREFERENCE if isa in available or isa == "portable")


def repacks(isa: str | None, layout: str = "auto") -> bool:
    """Whether block matrices are repacked into the x16 layout: kernels on an ISA that reads it, and
    `LOCALCHAT_KERNEL_LAYOUT` not `gguf` (for every block type; a K-quant matrix whose columns are no
    multiple of 256 stays as stored)."""
    return isa in X16_ISAS and layout == "auto"


def native_bf16(flags: Iterable[str]) -> bool:
    """AVX512-BF16 or AMX-BF16: bfloat16 math at full speed."""
    have = frozenset(flags)
    return "avx512_bf16" in have or "amx_bf16" in have


def compute_dtype(flags: Iterable[str]) -> str:
    """`--dtype auto` on the CPU: bfloat16 where it is native, else float32 (bf16 emulated in float32
    costs more than it saves)."""
    return "bfloat16" if native_bf16(flags) else "float32"


def emulated() -> str | None:
    """The CPU `LOCALCHAT_EMULATE_CPU` names, None when unset. An unknown name is an error (the load
    reports it like a bad LOCALCHAT_KERNELS)."""
    name = os.environ.get(EMULATE_ENV, "").strip().lower()
    if not name:
        return None
    if name not in EMULATED:
        raise BackendUnavailableError(
            f"{EMULATE_ENV}={name!r} is not a CPU; use one of {', '.join(EMULATED)}."
        )
    return name


def cpu_flags() -> frozenset[str]:
    """The flags every choice reads: the host's, narrowed to the emulated CPU's if one is set."""
    name = emulated()
    host = host_flags()
    return host if name is None else host & EMULATED[name]


def allowed(isa: str) -> bool:
    """Whether the kernels may run `isa` here: always, unless an emulated CPU lacks it (the compiled
    library tests the real CPU itself)."""
    name = emulated()
    return name is None or isa in runnable_isas(EMULATED[name])


def torch_env(name: str) -> dict[str, str]:
    """Variables that make torch (imported after they are set) dispatch as CPU `name` would, together
    with LOCALCHAT_EMULATE_CPU itself: for a subprocess that emulates `name`."""
    return {EMULATE_ENV: name, **_TORCH_ENV[name]}


@cache
def host_flags() -> frozenset[str]:
    """/proc/cpuinfo's flags (x86) or Features (ARM); empty where there is no such file (other OSes)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()
