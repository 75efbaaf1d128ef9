"""Decode steps in flight under TP x PP (`--tp 2 --pp 2`: four gloo processes, each stage a TP group of
two ranks): the engine keeps two steps in flight, each of its own group of requests, so stage 0's two
ranks run group B's step (their all-reduces on the stage's group) while stage 1's run group A's.
Greedy tokens equal the one-step-at-a-time engine on one device for ragged prompts with chunked
prefills, requests that finish mid-batch, preemption (a small KV pool), an abort while the request's
step is in flight, and a hybrid model; every block is free afterwards. And the property the overlap
rests on: a step's message reaches the first stage's ranks while a later stage is still busy."""

from __future__ import annotations

import functools
import time
from dataclasses import replace
from typing import Any, cast

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from localchat.backends.fake import FakeTokenizer
from localchat.backends.torch.parallel.driver import ParallelRunner, _free_port
from localchat.backends.torch.parallel.in_flight import ControlChannel, receive_message
from localchat.engine.engine import LLMEngine
from localchat.weights.bundle import ModelBundle
from tests.backends import test_pipeline_hybrid as hybrid
from tests.backends import test_pipeline_in_flight as in_flight
from tests.backends import test_pipeline_parallel as plain
from tests.helpers.torch_models import bundle_from_hf, exact_weights, tiny_hf_model

TP2_PP2 = replace(plain.PP2, tensor_parallel_size=2)


def mha_bundle() -> ModelBundle:
    """A 3-layer Llama with 4 KV heads (2 per rank), so that 1 MiB of K/V per rank is still small
    enough to preempt (with 2 KV heads a rank's one head would make the pool twice as deep). Also the
    workers' loader."""
    return bundle_from_hf(tiny_hf_model("llama", num_hidden_layers=3, num_key_value_heads=4))


def serve_and_check(
    ranks: ParallelRunner, want: list[list[int]], kv_cache_mib: int | None, abort: bool
) -> None:
    engine = LLMEngine(
        cast(Any, ranks),
        FakeTokenizer(),
        in_flight.config(kv_cache_mib),
        eos_token_ids=[2],
        model_max_len=1024,
    )
    assert engine.in_flight is not None and engine.in_flight.depth == 2
    got, aborted = in_flight.serve(engine, abort)
    if abort:
        in_flight.check_aborted(got, want, aborted)
    else:
        assert got == want
        assert (engine.scheduler.num_preemptions > 0) == (kv_cache_mib == 1)
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_usable_blocks
    assert not engine.scheduler.in_flight and not engine.in_flight.busy


@pytest.mark.slow  # spawns gloo ranks: out of the fast tier, still in CI
def test_tp2_by_pp2_steps_in_flight_match_one_device() -> None:
    torch.set_num_threads(1)
    bundle = mha_bundle()
    with exact_weights():
        ranks = ParallelRunner(bundle, TP2_PP2, load=mha_bundle)
    try:
        assert ranks.steps_in_flight == 2
        want, _ = in_flight.reference(bundle, 1)  # a pool that preempts (the roomy one: the hybrid's)
        serve_and_check(ranks, want, 1, abort=False)
        serve_and_check(ranks, want, 1, abort=True)
    finally:
        ranks.shutdown()


@pytest.mark.slow  # spawns gloo ranks: out of the fast tier, still in CI
def test_tp2_by_pp2_steps_in_flight_of_a_hybrid_match_one_device() -> None:
    """Qwen3.5 ([DeltaNet x3, attention]): stage 0's ranks keep state slots only, each half of a
    sequence's DeltaNet state; both groups' slots are taken, zeroed and freed on every rank in step
    order, with an abort in flight."""
    torch.set_num_threads(1)
    bundle = hybrid.hybrid_bundle("qwen3_5")
    want, _ = in_flight.reference(bundle, None)
    with exact_weights():
        ranks = ParallelRunner(bundle, TP2_PP2, load=functools.partial(hybrid.hybrid_bundle, "qwen3_5"))
    try:
        serve_and_check(ranks, want, None, abort=False)
        serve_and_check(ranks, want, None, abort=True)
    finally:
        ranks.shutdown()


LATE = 2.0  # seconds rank 3 (stage 1's second rank, busy with the step before) waits to receive


def _control_rank(rank: int, port: int, arrivals: Any) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=4)
    try:
        group = dist.new_group(backend="gloo")
        dist.barrier()
        start = time.monotonic()
        if rank == 0:
            ControlChannel(group).send(("execute_model", ()))
        else:
            if rank == 3:
                time.sleep(LATE)
            assert receive_message(group) == ("execute_model", ())
            arrivals[rank] = time.monotonic() - start
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # spawns gloo ranks: out of the fast tier, still in CI
def test_a_step_reaches_stage_0_while_stage_1_is_busy() -> None:
    """Rank 1 (stage 0) gets its message at once though rank 3 takes its own 2 s late. Through gloo's
    broadcast (a binomial tree: rank 1 passes it on to rank 3) rank 1 would wait the 2 s, and stage 0
    could not start step B before stage 1 had finished step A."""
    arrivals = mp.Manager().dict()
    mp.spawn(_control_rank, args=(_free_port(), arrivals), nprocs=4)
    assert arrivals[1] < LATE / 2 and arrivals[2] < LATE / 2, dict(arrivals)
    assert arrivals[3] >= LATE
