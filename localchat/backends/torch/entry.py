"""The torch backend's entry point for the backend registry (`localchat.backends.create_runner`): one
process's `TorchRunner`, the CPU + GPU layer split (`--gpu-layers`), or the tensor- / pipeline-parallel
driver over several processes (which imports runner.py, so the choice lives here rather than in it)."""

from __future__ import annotations

from localchat.backends import RunnerOptions
from localchat.backends.torch.runner import TorchRunner
from localchat.engine.interface import ModelRunner
from localchat.errors import BackendUnavailableError
from localchat.weights.bundle import ModelBundle


def create_runner(model: ModelBundle, options: RunnerOptions) -> ModelRunner:
    tp, pp = options.tensor_parallel_size, options.pipeline_parallel_size
    if options.gpu_layers is not None:
        if tp > 1 or pp > 1:
            raise BackendUnavailableError(
                "--gpu-layers splits one process's layers between a GPU and the CPU; it does not combine "
                "with --tensor-parallel-size or --pipeline-parallel-size."
            )
        from localchat.backends.torch.parallel.device_split import split_runner

        return split_runner(model, options)
    if tp > 1 or pp > 1:
        # imported here: only multi-process runs pay for torch.distributed
        from localchat.backends.torch.parallel.driver import ParallelRunner

        return ParallelRunner(model, options)
    return TorchRunner(model, options)
