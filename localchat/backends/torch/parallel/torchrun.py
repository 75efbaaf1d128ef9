"""`localchat serve --tp N` under torchrun: rank 0 serves (engine, HTTP) and joins the group from
torchrun's environment; ranks >= 1 run here, load their shard and serve rank 0's steps, never HTTP."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from localchat.backends.torch.device import pick_device

from .driver import BundleLoader, rank_options, worker_loop
from .group import init_group, torchrun_rank

if TYPE_CHECKING:
    from localchat.backends import RunnerOptions

log = logging.getLogger(__name__)


def worker_rank(tensor_parallel_size: int) -> int | None:
    """This process's rank when it is a torchrun worker (rank >= 1), else None (rank 0 or no torchrun)."""
    rank = torchrun_rank(tensor_parallel_size)
    return rank if rank else None


def serve_worker(rank: int, options: RunnerOptions, load: BundleLoader) -> int:
    """Run worker `rank` until rank 0 shuts down (exit code 0) or the group breaks (an exception).
    `options`: the server's runner options (this rank's device is picked here); `load`: the model."""
    options = rank_options(options, rank)
    group = init_group(None, None, pick_device(options.device))
    log.info("tensor-parallel worker rank %d of %d joined; serving rank 0's steps", rank, group.world_size)
    worker_loop(group, load, options)
    return 0
