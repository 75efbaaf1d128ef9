"""The torch backend's entry point for the backend registry (`localchat.backends.create_runner`): one
process's `TorchRunner`, or the tensor-parallel driver over several (which imports runner.py, so the
choice lives here rather than in it)."""

from __future__ import annotations

from localchat.backends import RunnerOptions
from localchat.backends.torch.runner import TorchRunner
from localchat.engine.interface import ModelRunner
from localchat.weights.bundle import ModelBundle


def create_runner(model: ModelBundle, options: RunnerOptions) -> ModelRunner:
    if options.tensor_parallel_size > 1:
        # imported here: only tensor-parallel runs pay for torch.distributed
        from localchat.backends.torch.parallel.driver import ParallelRunner

        return ParallelRunner(model, options)
    return TorchRunner(model, options)
