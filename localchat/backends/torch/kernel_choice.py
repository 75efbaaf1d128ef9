"""Which attention implementation and decode-graph mode a torch runner uses.

| device | attention | decode steps |
|---|---|---|
| cuda, Triton importable | Triton paged kernels (triton_attention.py; windows, soft-caps, scales too) | CUDA graphs per batch bucket, unless `--no-cuda-graphs` |
| cpu with localchat's kernels (kernels.py) | fused C kernel (csrc/lc_attention.h); prefill with a cache in another dtype than the compute: PyTorch | eager |
| cuda without Triton, mps, cpu | plain PyTorch (attention.py) | eager |

`LOCALCHAT_TORCH_ATTENTION=torch|triton` overrides the choice (`torch`: plain PyTorch, also on CPU). `triton` on a CPU only works under Triton's
interpreter (`TRITON_INTERPRET=1`): the tests use it to run the CUDA code paths, decode graphs included
(replayed eagerly through the same persistent buffers), without a GPU.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache

import torch

from localchat.backends.torch.cpu import kernels as cpu_kernels
from localchat.config import backend_variable
from localchat.errors import BackendUnavailableError

log = logging.getLogger(__name__)


def attention_kernel(device: torch.device) -> str:
    choice = backend_variable("LOCALCHAT_TORCH_ATTENTION")
    has_triton = importlib.util.find_spec("triton") is not None
    if choice == "torch":
        return "torch"
    if choice == "triton":
        if not has_triton or (device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1"):
            raise BackendUnavailableError(
                "LOCALCHAT_TORCH_ATTENTION=triton needs Triton and a CUDA device (or TRITON_INTERPRET=1)."
            )
        return "triton"
    return "triton" if device.type == "cuda" and has_triton else "torch"


# The choice pinned for the model step running on this thread (one_step_choice).
_step = threading.local()


def cpu_decode_kernels(device: torch.device) -> cpu_kernels.Kernels | None:
    """The compiled kernels that run CPU decode attention and the fused layer steps, None for the plain
    PyTorch path."""
    if device.type != "cpu":
        return None
    pinned = getattr(_step, "choice", None)
    return pinned[0] if pinned is not None else _read_choice()


@contextmanager
def one_step_choice(device: torch.device) -> Iterator[None]:
    """Read the env once for a whole model step: every layer asks several times (~90 env reads per
    SmolLM2 token otherwise), and a step must not switch paths halfway anyway. Off the CPU there is
    nothing to read (and the CPU library is not loaded, nor its absence logged)."""
    outer = getattr(_step, "choice", None)
    _step.choice = (_read_choice() if device.type == "cpu" else None,)
    try:
        yield
    finally:
        _step.choice = outer


def _read_choice() -> cpu_kernels.Kernels | None:
    """From the runner's backend settings while one runs the step (backend_settings.py), else the env."""
    try:
        if backend_variable("LOCALCHAT_TORCH_ATTENTION") == "torch":
            return None
        choice = cpu_kernels.isa_choice()
    except BackendUnavailableError as exc:
        _plain_path(str(exc))
        return None
    return _kernels_for(choice)


@cache
def _kernels_for(choice: str) -> cpu_kernels.Kernels | None:
    """Once per LOCALCHAT_KERNELS value: every step asks. A bad value is refused where a runner resolves
    its settings; outside one it only means the plain path (a step must not fail over it)."""
    try:
        return cpu_kernels.load(choice)
    except BackendUnavailableError as exc:
        _plain_path(str(exc))
        return None


@cache
def _plain_path(reason: str) -> None:
    log.warning("%s CPU decode attention runs in plain PyTorch.", reason)


def graph_mode(device: torch.device, attention: str, enabled: bool) -> str | None:
    """ "capture" (CUDA graphs), "eager" (the same buffers without graphs: the CPU twin), or None."""
    if not enabled or attention != "triton":
        return None
    return "capture" if device.type == "cuda" else "eager"
