"""Where and how the torch backend runs: device, dtype (table in runner.py), CPU threads, free RAM."""

from __future__ import annotations

import os

import torch

from localchat import cpu_features
from localchat.errors import BackendUnavailableError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# torch's own default (physical cores, or OMP_NUM_THREADS), read before any runner changes it.
_TORCH_DEFAULT_THREADS = torch.get_num_threads()


def pick_device(name: str) -> torch.device:
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise BackendUnavailableError(
            f"Unknown torch device {name!r}; use auto, cpu, cuda, cuda:N or mps."
        ) from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise BackendUnavailableError("CUDA was requested but this torch build sees no CUDA device.")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise BackendUnavailableError("MPS was requested but is not available on this machine.")
    return device


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    if name != "auto":
        if name not in DTYPES:
            raise BackendUnavailableError(f"Unknown dtype {name!r}; use auto, {', '.join(DTYPES)}.")
        return DTYPES[name]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device.type == "mps":
        return torch.float16
    return DTYPES[cpu_features.compute_dtype(cpu_features.cpu_flags())]


def cpu_threads(requested: int | None) -> int:
    """Intra-op threads to start with: as requested, else what OMP_NUM_THREADS says, else all cores
    but one (the safe count: see localchat/backends/torch/cpu/threads.py, which may then switch to all cores)."""
    if requested:
        return requested
    if os.environ.get("OMP_NUM_THREADS"):
        return _TORCH_DEFAULT_THREADS
    return max(1, _TORCH_DEFAULT_THREADS - 1)


def adaptive_thread_choices(requested: int | None) -> tuple[int, int] | None:
    """(all cores but one, all cores) when the count is ours to choose per step, else None (the user
    set it, by option or OMP_NUM_THREADS, or there is a single core)."""
    if requested or os.environ.get("OMP_NUM_THREADS") or _TORCH_DEFAULT_THREADS < 2:
        return None
    return (_TORCH_DEFAULT_THREADS - 1, _TORCH_DEFAULT_THREADS)
