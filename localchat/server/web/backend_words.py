"""The inference backend in words for people (About dialog): "PyTorch on CPU (AVX-512 VNNI)" rather than
a Python class or module name. Reads only the runner's attributes and module name, so it never imports
torch or mlx itself."""

from __future__ import annotations

import sys
from typing import Any

# The kernel library's ISA names (localchat.cpu_features) as their makers write them.
ISA_WORDS = {"portable": "portable C", "avx2": "AVX2", "avx512vnni": "AVX-512 VNNI", "neon": "NEON"}


def _library(runner: Any) -> str:
    module = type(runner).__module__
    if module.startswith("localchat.backends.torch"):
        return "PyTorch"
    if module.startswith("localchat.backends.mlx"):
        return "MLX"
    if module.startswith("localchat.backends.fake"):
        return "the test backend (no model)"
    return module.rsplit(".", 1)[-1]


def _device(runner: Any, name: str) -> str:
    lowered = name.lower()
    if lowered.startswith("cuda"):
        head = name.split(" (", 1)[0]  # "cuda:0 NVIDIA H200 (bfloat16, ...)" -> the card's name
        gpu = head.split(maxsplit=1)[1] if " " in head else ""
        return f"NVIDIA GPU ({gpu})" if gpu else "NVIDIA GPU"
    if lowered.startswith("mps") or "metal" in lowered:
        return "Apple GPU (Metal)"
    kernels = getattr(getattr(getattr(runner, "quant", None), "kernels", None), "name", None)
    if isinstance(kernels, str) and kernels in ISA_WORDS:
        return f"CPU ({ISA_WORDS[kernels]})"
    isa = _torch_cpu_capability() if type(runner).__module__.startswith("localchat.backends.torch") else None
    return f"CPU ({isa})" if isa else "CPU"


def _torch_cpu_capability() -> str | None:
    """The vector ISA torch's own CPU kernels use, asked of the torch a torch runner already loaded
    (looked up in sys.modules: this module must not import torch)."""
    torch = sys.modules.get("torch")
    try:
        capability = str(torch.backends.cpu.get_cpu_capability()) if torch is not None else ""
    except AttributeError:  # an older torch
        return None
    return {"AVX512": "AVX-512", "AVX2": "AVX2", "NEON": "NEON", "SVE256": "SVE"}.get(capability)


def backend_in_words(runner: Any | None, configured: str) -> str:
    """ "PyTorch on CPU (AVX2)", "MLX on Apple GPU (Metal)", or the configured choice before a model
    is loaded ("auto: picked when a model loads")."""
    if runner is None:
        return "picked when a model loads" if configured == "auto" else f"{configured} (no model loaded)"
    name = str(getattr(runner, "device_name", "") or "")
    return f"{_library(runner)} on {_device(runner, name)}"
