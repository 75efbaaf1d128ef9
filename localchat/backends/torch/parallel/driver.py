"""Driver/worker split for tensor parallelism.

Rank 0 (the localchat process) owns the engine, scheduler, HTTP server and tokenizer; it holds a
`ParallelRunner`, which forwards every runner call that runs the model (KV setup, warm-up, steps,
shutdown) to the workers as plain data (the step's SchedulerOutput and BatchInputs: numpy arrays and
lists) over a gloo control group, then runs the same call on its own shard. Workers (`worker_main`)
loop on those messages, running the same forward on their shard; their sampled tokens are discarded
(rank 0's are the answer). The collectives inside the forward join the ranks.

Workers are started here with torch.multiprocessing (spawn, daemonic: they die with the server) or
by torchrun (see docs/parallel.md). A worker that exits is reported before the next step, and a
collective that waits on a dead rank times out (group.py) rather than hanging.
"""

from __future__ import annotations

import atexit
import functools
import logging
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from multiprocessing.connection import wait
from typing import TYPE_CHECKING, Any

import torch.distributed as dist
import torch.multiprocessing as mp
from torch.multiprocessing.spawn import ProcessContext, ProcessException

from localchat.backends import RunnerOptions
from localchat.backends.torch.device import pick_device
from localchat.errors import BackendUnavailableError
from localchat.weights.bundle import ModelBundle

from .group import ParallelGroup, close_group, init_group, release_groups, torchrun_local_rank, torchrun_rank
from .in_flight import ControlChannel, ResultsInbox, receive_message
from .pipeline import PipelineStageRunner, pipeline_runner
from .shard import sharded_runner

if TYPE_CHECKING:
    from localchat.backends.torch.runner import TorchRunner
    from localchat.engine.interface import BatchInputs, RunnerOutput, SchedulerOutput

log = logging.getLogger(__name__)

# The methods that run the model (or collectives) and so must run on every rank, in the same order.
FORWARDED = frozenset(
    {
        "available_kv_memory",
        "initialize_kv_cache",
        "initialize_state_cache",  # hybrid models: every stage's own state-slot layers
        "prepare_decode_graphs",
        "execute_model",
        "compute_logits",
    }
)
SHUTDOWN = "shutdown"
STEPS = frozenset({"execute_model", "compute_logits"})  # (scheduler_output, batch)
# Workers wait on the control group between requests, so its timeout is an idle limit, not a
# deadline: a dead driver closes the connection, which wakes them with an error anyway.
CONTROL_TIMEOUT = timedelta(days=7)

BundleLoader = Callable[[], ModelBundle]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def world_size(options: RunnerOptions) -> int:
    """Ranks in the group: tensor-parallel slices times pipeline stages."""
    return options.tensor_parallel_size * options.pipeline_parallel_size


def _kind(options: RunnerOptions) -> str:
    return "pipeline-parallel" if options.pipeline_parallel_size > 1 else "tensor-parallel"


def _flag(options: RunnerOptions) -> str:
    return "--pipeline-parallel-size" if options.pipeline_parallel_size > 1 else "--tensor-parallel-size"


def _size_flag(options: RunnerOptions) -> str:
    return f"{_flag(options)} {world_size(options)}"


def rank_runner(bundle: ModelBundle, options: RunnerOptions, group: ParallelGroup) -> TorchRunner:
    """This rank's runner: its tensor-parallel slice, its pipeline stage, or its slice of a stage."""
    if options.pipeline_parallel_size > 1:
        return pipeline_runner(bundle, options, group)
    return sharded_runner(bundle, options, group)


def rank_options(options: RunnerOptions, rank: int) -> RunnerOptions:
    """Each rank's device: on CUDA, `--device-ids`' entry for the rank's index on its machine (the rank
    itself, or torchrun's LOCAL_RANK across machines), default cuda:<index>; the CPU otherwise."""
    device = pick_device(options.device)
    if device.type == "cuda":
        local = torchrun_local_rank()
        index = rank if local is None else local
        world = world_size(options)
        ids = options.device_ids or tuple(range(world if local is None else index + 1))
        if local is None and len(ids) != world:
            raise BackendUnavailableError(
                f"--device-ids names {len(ids)} GPUs for {_size_flag(options)}: name one per rank."
            )
        count = device_count()
        if index >= len(ids) or ids[index] >= count:
            raise BackendUnavailableError(
                f"{_size_flag(options)}: rank {rank} needs a GPU of its own but this machine has {count}. "
                f"Lower {_flag(options)}, fix --device-ids, or run "
                "the other ranks on more machines with torchrun (docs/parallel.md)."
            )
        return _replace_device(options, f"cuda:{ids[index]}")
    if device.type != "cpu":
        raise BackendUnavailableError(f"{_flag(options)} needs CUDA or the CPU, not {device.type}.")
    return _replace_device(options, "cpu")


def device_count() -> int:
    import torch

    return torch.cuda.device_count()


def _replace_device(options: RunnerOptions, device: str) -> RunnerOptions:
    return replace(options, device=device)


def worker_main(index: int, world: int, init_method: str, load: BundleLoader, options: RunnerOptions) -> None:
    """One spawned worker rank: join the group, load and shard the model, then run whatever rank 0
    sends. `index`: torch.multiprocessing's process number, from 0; rank 0 is the driver."""
    rank = index + 1
    # Ctrl-C (or a SIGINT the server's process group gets) is the driver's to handle: it tells the
    # workers to stop, and they are daemonic, so they never outlive it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    options = rank_options(options, rank)
    group = init_group(rank, world, pick_device(options.device), init_method=init_method)
    worker_loop(group, load, options)


def worker_loop(group: ParallelGroup, load: BundleLoader, options: RunnerOptions) -> None:
    """A worker rank in a joined group (spawned, or started by torchrun): serve rank 0's calls until
    it says shutdown. `options` already name this rank's device."""
    control = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)
    try:
        runner = rank_runner(load(), options, group)
        while True:
            name, args = receive_message(control)
            if name == SHUTDOWN:
                runner.shutdown()
                return
            getattr(runner, name)(*args)
    except BaseException:
        # Printed here: the driver only sees the closed connection; the cause is this rank's.
        print(
            f"{_kind(options)} worker rank {group.rank} failed:\n{traceback.format_exc()}",
            file=sys.stderr,
            flush=True,
        )
        raise
    finally:
        close_group()


class ParallelRunner:
    """Rank 0's runner: the `ModelRunner` the engine sees, with the workers behind it.

    `failure` is None while every rank is up, else why the model cannot run any more (a worker died,
    a collective failed); the engine reads it to fail requests with that message and /health shows it.
    Spawned workers are watched by a thread, so a death is logged and reported within a second even
    while the server is idle; torchrun's workers live on other machines, so theirs shows at the next
    step (the collective fails when the peer's connection closes)."""

    def __init__(self, bundle: ModelBundle, options: RunnerOptions, load: BundleLoader | None = None) -> None:
        world = world_size(options)
        self.kind = _kind(options)
        options = rank_options(options, 0)
        device = pick_device(options.device)
        self.failure: str | None = None
        self._closed = False
        # Under --pp alone every worker is a later stage: a step's pictures are turned into rows on
        # rank 0's stage, so their pixels are not sent on (their placeholder runs are, for the masks).
        self._workers_skip_pictures = options.pipeline_parallel_size > 1 and options.tensor_parallel_size == 1
        self.context: ProcessContext | None = None
        self._watchdog: threading.Thread | None = None
        self.exit_codes: list[int | None] = []  # the spawned workers', read at shutdown
        if torchrun_rank(world) is not None:  # started by torchrun: the workers are already running
            self.group = init_group(None, None, device)
        else:
            init_method = f"tcp://127.0.0.1:{_free_port()}"
            # The workers reload the model themselves: a bundle's weight reader does not cross processes.
            load = load or functools.partial(_load_from_path, str(bundle.path), bundle.name)
            self.context = mp.start_processes(
                worker_main,
                args=(world, init_method, load, options),
                nprocs=world - 1,
                join=False,
                daemon=True,
                start_method="spawn",
            )
            self._watchdog = threading.Thread(
                target=self._watch_workers, name="localchat-tp-watchdog", daemon=True
            )
            self._watchdog.start()
            self.group = init_group(0, world, device, init_method=init_method)
        self._control = ControlChannel(dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT))
        self.runner = rank_runner(bundle, options, self.group)
        # --pp (alone or under TP x PP): as many steps in flight as stages, each of its own group of
        # sequences (the engine's StepsInFlight), so every stage has work.
        self.steps_in_flight = options.pipeline_parallel_size
        self._inbox: ResultsInbox | None = None
        # The server stops engines without closing their runners; at exit the workers are told to stop
        # (torchrun's on other nodes then exit 0 instead of failing on the closed connection).
        atexit.register(self.shutdown)

    def _watch_workers(self) -> None:
        assert self.context is not None
        processes = self.context.processes
        died = wait([p.sentinel for p in processes])
        if self._closed:
            return
        rank = 1 + next(i for i, p in enumerate(processes) if p.sentinel in died)
        code = processes[rank - 1].exitcode
        self._fail(
            f"The {self.kind} worker rank {rank} died (exit code {code}); the model cannot run. "
            "Restart localchat."
        )

    def _fail(self, message: str) -> None:
        if self.failure is None:
            self.failure = message
            log.error("%s", message)

    def _send(self, name: str, args: tuple[Any, ...]) -> None:
        """To every worker. A step does not wait for the broadcast (the control thread's): the step's
        own sends and collectives pair with the workers, and a step in flight must not wait for the
        one before it; a failed broadcast is raised at the next call."""
        if self.failure is not None:
            raise BackendUnavailableError(self.failure)
        self._control.send((name, args), wait=name not in STEPS)

    def __getattr__(self, name: str) -> Any:
        if name == "runner":  # not set yet (a failed __init__): no recursion through __getattr__
            raise AttributeError(name)
        attr = getattr(self.runner, name)
        if name not in FORWARDED:
            return attr  # properties and calls that touch no collective (kv_cache_spec, device_name, ...)

        def forwarded(*args: Any) -> Any:
            def call() -> Any:
                self._send(name, self._worker_args(name, args))
                return attr(*args)

            return self._guarded(call)

        return forwarded

    def _guarded(self, call: Callable[[], Any]) -> Any:
        """`call()`, with a dead worker or failed collective turned into the model's failure."""
        try:
            return call()
        except BackendUnavailableError:
            raise
        except Exception as exc:
            if self._worker_died() or isinstance(exc, dist.DistError):
                self._fail(
                    f"A {self.kind} collective failed ({exc}); a worker rank is gone or "
                    "unreachable. Restart every rank."
                )
                raise BackendUnavailableError(str(self.failure)) from exc
            raise  # a bug on this rank's side: the engine fails the step's requests, as with one rank

    @property
    def supports_speculation(self) -> bool:
        """Not with steps in flight: a group's drafts would be scored a step late."""
        return self.steps_in_flight == 1 and bool(getattr(self.runner, "supports_speculation", True))

    @property
    def hybrid_speculation(self) -> bool:
        """A hybrid model's verify rows: every rank writes its share of each position's state into the
        spec rows the step's BatchInputs.state_keep names (engine/hybrid_spec.py); not with steps in
        flight (the copies back would need ordering across stages)."""
        return self.steps_in_flight == 1 and bool(getattr(self.runner, "hybrid_speculation", False))

    def submit_step(self, scheduler_output: SchedulerOutput, batch: BatchInputs) -> None:
        """Start a step without waiting for its output (`--pp`; the engine keeps `steps_in_flight`
        of them, each of other sequences): the workers get it from the control thread, rank 0 runs
        its stage and hands the hidden states on, the results thread receives the output."""
        runner = self.runner
        assert isinstance(runner, PipelineStageRunner)
        if self._inbox is None:
            self._inbox = ResultsInbox(runner.receive_output)
        inbox = self._inbox

        def call() -> None:
            self._send("execute_model", self._worker_args("execute_model", (scheduler_output, batch)))
            runner.start_step(scheduler_output, batch)
            inbox.expect()

        self._guarded(call)

    def finish_step(self) -> RunnerOutput:
        """The oldest submitted step's output (waits for the last stage)."""
        inbox = self._inbox
        assert inbox is not None, "finish_step before submit_step"
        return self._guarded(inbox.take)

    def _worker_args(self, name: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
        if not self._workers_skip_pictures or name not in STEPS or not args[1].image_slices:
            return args
        # the placeholder runs go on: a later stage builds the same picture masks (Gemma 3)
        slices = [replace(s, image=replace(s.image, pixels=None)) for s in args[1].image_slices]
        return (args[0], replace(args[1], image_slices=slices))

    def _worker_died(self) -> bool:
        """After a failed call: did a worker die (the watchdog names it; give it a moment to see the
        exit)?"""
        deadline = time.monotonic() + 2.0
        while self.failure is None and self.context is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.failure is not None

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._send(SHUTDOWN, ())
        except (RuntimeError, BackendUnavailableError) as exc:
            log.warning("%s shutdown: %s", self.kind, exc)
        self._control.close()
        if self._inbox is not None:
            self._inbox.close()
        self.runner.shutdown()
        if self.context is not None:
            self._end_workers(self.context)
        close_group()
        release_groups(self.runner)
        # atexit's reference would keep this runner (its model, its workers' handles) for good.
        atexit.unregister(self.shutdown)

    def _end_workers(self, context: ProcessContext) -> None:
        """Wait for the workers to exit, then release each one's two spawn pipes (its sentinel and
        the pipe its start-up data went through), which multiprocessing keeps open until the process
        object is closed or collected: 2 descriptors leaked per runner before."""
        try:
            context.join(timeout=30)
        except ProcessException as exc:  # a worker that died before: already reported
            log.warning("%s shutdown: %s", self.kind, exc)
        for process in context.processes:
            if process.is_alive():
                process.terminate()
                process.join(timeout=5)
        if self._watchdog is not None:  # it waits on the sentinels: they must outlive its wait
            self._watchdog.join(timeout=5)
        self.exit_codes = [process.exitcode for process in context.processes]
        if self._watchdog is None or not self._watchdog.is_alive():
            for process in context.processes:
                if process.exitcode is not None:
                    process.close()


def _load_from_path(path: str, name: str) -> ModelBundle:
    from localchat.weights.loader import load_model

    return load_model(path, name)
