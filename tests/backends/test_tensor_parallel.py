"""Tensor parallelism on gloo with 2 CPU processes (the CPU twin of NCCL): a sharded tiny Llama gives
the unsharded model's logits and greedy tokens through the runner's real step path (batched ragged
prefill, then batched decode), with KV heads split across ranks and replicated (1 KV head, 2 ranks)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import cast

import pytest
import torch
import torch.multiprocessing as mp

from localchat.backends import RunnerOptions, create_runner
from localchat.backends.torch.parallel.driver import ParallelRunner
from localchat.backends.torch.parallel.group import ParallelGroup, close_group, init_group
from localchat.backends.torch.parallel.memory import check_shard_fits
from localchat.backends.torch.parallel.shard import sharded_runner
from localchat.backends.torch.runner import TorchRunner
from localchat.errors import BackendUnavailableError
from localchat.weights.bundle import ModelBundle
from tests.helpers.torch_batch import PagedDriver
from tests.helpers.torch_models import bundle_from_hf, exact_weights, fp32_runner, tiny_hf_model

PROMPTS = {"a": [5, 9, 17, 33, 64, 2, 100], "b": [7, 8, 9], "c": list(range(40, 61))}
DECODE_STEPS = 5


def _run(runner: TorchRunner) -> tuple[list[torch.Tensor], dict[str, list[int]]]:
    """Prefill all prompts in one batch, then decode greedily; the logits of every step."""
    driver = PagedDriver(runner, num_blocks=32, block_size=4)
    for req_id, prompt in PROMPTS.items():
        driver.add(req_id, prompt)
    steps = []
    for _ in range(DECODE_STEPS + 1):
        req_ids, logits = driver.step_logits()
        steps.append(logits.cpu())
        for req_id, row in zip(req_ids, logits, strict=True):
            driver.feed(req_id, int(row.argmax()))
    return steps, {r: driver.tokens(r)[len(p) :] for r, p in PROMPTS.items()}


def _runner(kv_heads: int) -> TorchRunner:
    return fp32_runner(_hf_bundle(kv_heads))


def _hf_bundle(kv_heads: int) -> ModelBundle:
    return bundle_from_hf(tiny_hf_model("llama", num_key_value_heads=kv_heads, vocab_size=255))


EXACT = RunnerOptions(device="cpu", dtype="float32", num_threads=1)


def _worker(rank: int, world: int, init: str, out: str, kv_heads: int) -> None:
    torch.set_num_threads(1)
    group = init_group(rank, world, torch.device("cpu"), init_method=init)
    try:
        with exact_weights():
            runner = sharded_runner(_hf_bundle(kv_heads), EXACT, group)
        result = _run(runner)
        # Each rank really holds a slice: 2 of 4 q heads, its KV heads, half the vocab rows.
        layer = runner.model.layers[0]
        assert (layer.heads, layer.kv_heads) == (2, max(kv_heads // world, 1))
        assert runner.kv_caches[0].shape[1] == max(kv_heads // world, 1)
        assert runner.model.embed.shape[0] == 128
        if rank == 0:
            torch.save(result, out)
    finally:
        close_group()


@pytest.mark.parametrize("kv_heads", [2, 1], ids=["kv-split", "kv-replicated"])
@pytest.mark.slow  # spawns gloo ranks: out of the fast tier, still in CI
def test_tp2_matches_tp1_logits_and_greedy_tokens(tmp_path: Path, kv_heads: int) -> None:
    torch.set_num_threads(1)
    expected_logits, expected_tokens = _run(_runner(kv_heads))
    out = tmp_path / "rank0.pt"
    init = f"file://{tmp_path / 'rendezvous'}"
    mp.start_processes(_worker, args=(2, init, str(out), kv_heads), nprocs=2, join=True, start_method="spawn")
    logits, tokens = torch.load(out)
    assert tokens == expected_tokens
    assert len(logits) == len(expected_logits)
    for ours, ref in zip(logits, expected_logits, strict=True):
        assert ours.shape == ref.shape  # vocab 255 over 2 ranks: the padded row is cut off
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


def test_unsupported_family_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every family in the registry is sharded now, so one is taken off the list (SmolLM3, the example
    until it was sharded): refused before any weight is read, with --pp named."""
    from localchat.arch.registry import ARCHITECTURES
    from localchat.backends.torch.parallel import shard

    assert {a.family for a in ARCHITECTURES.values()} <= set(shard.SHARDED_FAMILIES)
    monkeypatch.setattr(shard, "SHARDED_FAMILIES", tuple(f for f in shard.SHARDED_FAMILIES if f != "smollm3"))
    bundle = bundle_from_hf(tiny_hf_model("smollm3"))
    with pytest.raises(BackendUnavailableError, match=r"only the Llama family.*--pipeline-parallel-size 2 "):
        sharded_runner(bundle, EXACT, ParallelGroup(0, 2))


def test_sizes_that_do_not_split_the_heads_name_the_ones_that_do() -> None:
    """Checked from the config, before any weight is read: the message lists the sizes that work."""
    bundle = _hf_bundle(2)  # 4 heads, 2 KV heads
    with pytest.raises(
        BackendUnavailableError, match=r"--tensor-parallel-size 3 does not split.*work for it: 1, 2, 4"
    ):
        sharded_runner(bundle, EXACT, ParallelGroup(0, 3))


def test_more_ranks_than_gpus_says_what_to_change(monkeypatch: pytest.MonkeyPatch) -> None:
    """The per-rank device check, with this machine's GPU count given (CI has none)."""
    from localchat.backends.torch.parallel import driver

    monkeypatch.setattr(driver, "pick_device", lambda name: torch.device("cuda"))
    monkeypatch.setattr(driver, "device_count", lambda: 1)
    options = RunnerOptions(device="cuda", tensor_parallel_size=2)
    assert driver.rank_options(options, 0).device == "cuda:0"
    with pytest.raises(BackendUnavailableError, match="rank 1 needs a GPU of its own but this machine has 1"):
        driver.rank_options(options, 1)
    with pytest.raises(BackendUnavailableError, match="names 1 GPUs for --tensor-parallel-size 2"):
        driver.rank_options(RunnerOptions(device="cuda", tensor_parallel_size=2, device_ids=(0,)), 0)


def _tiny_bundle() -> ModelBundle:
    """The workers' loader (a real server's workers reload the model from its path)."""
    return _hf_bundle(2)


@pytest.mark.slow  # spawns gloo ranks: out of the fast tier, still in CI
def test_parallel_runner_drives_a_spawned_worker_and_reports_its_death() -> None:
    """The driver/worker split behind `--tp 2`: rank 0's runner forwards each step to a spawned worker;
    greedy tokens equal TP=1; shutdown ends the worker; a dead worker is an error, not a hang."""
    torch.set_num_threads(1)
    _, expected_tokens = _run(_runner(2))
    options = RunnerOptions(device="cpu", dtype="float32", num_threads=1, tensor_parallel_size=2)
    runner = ParallelRunner(_tiny_bundle(), options, load=_tiny_bundle)
    _, tokens = _run(cast(TorchRunner, runner))
    assert tokens == expected_tokens
    runner.shutdown()
    # Shutdown lets go of the gloo groups: the control thread, which held them and their sockets and
    # event loop (~15 descriptors a runner), is gone.
    assert not any(t.name == "localchat-pp-control" for t in threading.enumerate())
    assert runner.context is not None  # spawned here, not by torchrun
    assert runner.exit_codes == [0]
    # Nothing of a runner outlives its shutdown: 2 more starts leave the descriptor count as it was
    # (each leaked the worker's 2 spawn pipes, and before that the control group's 13 more).
    before = _open_descriptors()
    for _ in range(2):
        ParallelRunner(_tiny_bundle(), options, load=_tiny_bundle).shutdown()
    assert _open_descriptors() == before

    runner = ParallelRunner(_tiny_bundle(), options, load=_tiny_bundle)
    try:
        assert runner.context is not None
        worker = runner.context.processes[0]
        worker.kill()
        worker.join(timeout=10)
        # The watchdog sees the death with no step running (an idle server's /health reads it).
        deadline = time.monotonic() + 5
        while runner.failure is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert runner.failure is not None and "worker rank 1 died" in runner.failure
        with pytest.raises(BackendUnavailableError, match="worker rank 1 died"):
            runner.initialize_kv_cache(8, 4)
    finally:
        runner.shutdown()


def _open_descriptors() -> list[str]:
    return sorted(os.listdir("/proc/self/fd"), key=int)


def test_tensor_parallel_needs_the_torch_backend() -> None:
    options = RunnerOptions(tensor_parallel_size=2)
    with pytest.raises(BackendUnavailableError, match="needs the torch backend, not mlx"):
        create_runner("mlx", _tiny_bundle(), options)


def test_a_slice_too_big_for_its_gpu_says_what_to_change() -> None:
    """The per-rank memory check (run on CUDA ranks before loading), with the free memory given."""
    gib = 2**30
    check_shard_fits(1, "cuda:1", 2, total_bytes=16 * gib, free_bytes=10 * gib, sizes=[1, 2, 4, 8])  # fits
    with pytest.raises(
        BackendUnavailableError,
        match=r"rank 1's slice .* needs about 8.8 GiB but cuda:1 has 6.0 GiB free\. Use --tensor-parallel-size 4",
    ):
        check_shard_fits(1, "cuda:1", 2, total_bytes=16 * gib, free_bytes=6 * gib, sizes=[1, 2, 4, 8])
    with pytest.raises(BackendUnavailableError, match="Use more GPUs"):
        check_shard_fits(0, "cuda:0", 2, total_bytes=16 * gib, free_bytes=1 * gib, sizes=[1, 2])
