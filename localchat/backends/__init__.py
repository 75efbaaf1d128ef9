"""Backend registry. Backends are imported lazily so `localchat` never pulls torch or mlx by itself.

`create_runner(name, model, options)` returns a `localchat.engine.interface.ModelRunner`;
`load_runner` does the same for a bundle that nothing else will read weights from again, and then frees
what loading left behind.
"""

from __future__ import annotations

import importlib
import platform
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from localchat.errors import BackendUnavailableError
from localchat.host_memory import trim_heap

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from localchat.embeddings.model import Encoder
    from localchat.embeddings.st_config import SentenceConfig
    from localchat.engine.interface import ModelRunner
    from localchat.weights.loader import ModelBundle

BACKENDS = ("torch", "mlx", "fake")


@dataclass(slots=True)
class RunnerOptions:
    device: str = "auto"  # torch: auto | cpu | cuda | cuda:N | mps
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    seed: int = 0  # seeds the global generator that unseeded requests draw from
    num_threads: int | None = None  # CPU compute threads; None: the backend's choice
    cuda_graphs: bool = True  # torch on CUDA: replay captured graphs for decode steps
    isq: str | None = None  # torch: "q4" | "q8_0" | "q4_k" | "q4_0" quantizes unquantized weights at load
    kv_cache_dtype: str = "auto"  # auto (the compute dtype) | bf16 | int8 (torch only)
    tensor_parallel_size: int = 1  # torch: ranks sharing each layer (backends/torch/parallel)
    device_ids: tuple[int, ...] | None = None  # torch with tensor parallelism: rank i's CUDA device
    pipeline_parallel_size: int = 1  # torch: ranks each holding a run of layers (backends/torch/parallel)
    gpu_layers: int | None = None  # torch: the last N layers on CUDA, the rest on the CPU, one process
    # torch: the seven tuning variables as resolve_backend_variables gave them (backend_settings.py);
    # None: the runner resolves them from the environment when it loads
    backend_settings: dict[str, str] | None = None


def resolve_backend(name: str) -> str:
    """`auto` is mlx on Apple Silicon when mlx imports, else torch."""
    if name != "auto":
        if name not in BACKENDS:
            raise BackendUnavailableError(
                f"Unknown backend {name!r}; choose one of auto, {', '.join(BACKENDS)}."
            )
        return name
    if sys.platform == "darwin" and platform.machine() == "arm64":
        try:
            importlib.import_module("mlx.core")
            return "mlx"
        except ImportError:
            pass
    return "torch"


# Each backend's module with `create_runner(model, options)`, imported by name when first asked for.
_ENTRY_MODULES = {
    "torch": "localchat.backends.torch.entry",
    "mlx": "localchat.backends.mlx.runner",
    "fake": "localchat.backends.fake",
}


def create_runner(name: str, model: ModelBundle, options: RunnerOptions | None = None) -> ModelRunner:
    name = resolve_backend(name)
    options = options or RunnerOptions()
    if options.tensor_parallel_size > 1 and name != "torch":
        raise BackendUnavailableError(
            f"--tensor-parallel-size {options.tensor_parallel_size} needs the torch backend, not {name}."
        )
    if options.pipeline_parallel_size > 1 and name != "torch":
        raise BackendUnavailableError(
            f"--pipeline-parallel-size {options.pipeline_parallel_size} needs the torch backend, not {name}."
        )
    if options.gpu_layers is not None and name != "torch":
        raise BackendUnavailableError(f"--gpu-layers needs the torch backend, not {name}.")
    try:
        module = importlib.import_module(_ENTRY_MODULES[name])
    except ImportError as exc:
        hint = {"torch": 'pip install "torch>=2.4"', "mlx": 'pip install "localchat-app[mlx]"'}.get(name, "")
        raise BackendUnavailableError(
            f"The {name} backend cannot be imported ({exc}). {hint}".strip()
        ) from exc
    return module.create_runner(model, options)


def load_encoder(
    folder: Path, threads: int | None = None, rerank: bool = False
) -> tuple[Encoder, SentenceConfig]:
    """An embedding or rerank encoder on the torch backend (the only one with encoders), imported by
    name here so the embeddings layer never imports a backend itself."""
    try:
        module = importlib.import_module("localchat.backends.torch.encoders")
    except ImportError as exc:
        raise BackendUnavailableError(
            f'Embedding models need the torch backend, which cannot be imported ({exc}). pip install "torch>=2.4"'
        ) from exc
    encoder, sentence = module.load_encoder(folder, threads=threads, rerank=rerank)
    return encoder, sentence


def serve_torchrun_worker(
    tensor_parallel_size: int, options: RunnerOptions, load: Callable[[], ModelBundle]
) -> int | None:
    """Under torchrun, ranks >= 1 run rank 0's steps instead of serving HTTP: their exit code, or None
    on rank 0 (and outside torchrun), which goes on to serve. The caller (the CLI) builds the runner
    options and the model loader from its settings, so the backend never reaches up into the app layer;
    `load` runs only on a worker rank."""
    try:
        module = importlib.import_module("localchat.backends.torch.parallel.torchrun")
    except ImportError as exc:
        raise BackendUnavailableError(
            f'--tensor-parallel-size needs the torch backend, which cannot be imported ({exc}). pip install "torch>=2.4"'
        ) from exc
    rank: int | None = module.worker_rank(tensor_parallel_size)
    return None if rank is None else int(module.serve_worker(rank, options, load))


def load_runner(name: str, model: ModelBundle, options: RunnerOptions | None = None) -> ModelRunner:
    """`create_runner`, then release the bundle's weight source and trim the heap. Measured on the dev
    box (SmolLM2-135M Q4_1, torch): resident memory after load 826 -> 627 MiB."""
    runner = create_runner(name, model, options)
    model.release_weights()
    trim_heap()
    return runner
