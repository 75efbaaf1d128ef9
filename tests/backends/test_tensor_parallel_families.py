"""Tensor parallelism beyond Llama on gloo with 2 CPU processes: Qwen3 (q/k norm) and the MoE families
(Mixtral, Qwen3-MoE), whose experts are cut like the dense MLP along their intermediate dim (router
replicated, one all-reduce after the MoE block). TP=2 logits and greedy tokens equal TP=1's."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest
import torch
import torch.multiprocessing as mp

from localchat.backends import RunnerOptions
from localchat.backends.torch.models.moe import Expert, SparseMoe
from localchat.backends.torch.parallel.group import close_group, init_group
from localchat.backends.torch.parallel.shard import sharded_runner
from localchat.weights.bundle import ModelBundle
from tests.backends.test_tensor_parallel import _run
from tests.helpers.torch_models import bundle_from_hf, exact_weights, fp32_runner, tiny_hf_model

OPTIONS = RunnerOptions(device="cpu", dtype="float32", num_threads=1)


def _bundle(model_type: str) -> ModelBundle:
    return bundle_from_hf(tiny_hf_model(model_type, vocab_size=255))


def _worker(rank: int, world: int, init: str, out: str, model_type: str) -> None:
    torch.set_num_threads(1)
    group = init_group(rank, world, torch.device("cpu"), init_method=init)
    try:
        with exact_weights():
            runner = sharded_runner(_bundle(model_type), OPTIONS, group)
        result = _run(runner)
        moe = next((m for m in runner.model.modules() if isinstance(m, SparseMoe)), None)
        widths = None if moe is None else [tuple(cast(Expert, e).down.shape) for e in moe.experts]
        if rank == 0:
            torch.save((result, widths), out)
    finally:
        close_group()


@pytest.mark.parametrize("model_type", ["qwen3", "mixtral", "qwen3_moe"])
@pytest.mark.slow  # spawns gloo ranks: out of the fast tier, still in CI
def test_tp2_matches_tp1(tmp_path: Path, model_type: str) -> None:
    torch.set_num_threads(1)
    expected_logits, expected_tokens = _run(fp32_runner(_bundle(model_type)))
    full = fp32_runner(_bundle(model_type))
    moe = next((m for m in full.model.modules() if isinstance(m, SparseMoe)), None)
    out = tmp_path / "rank0.pt"
    init = f"file://{tmp_path / 'rendezvous'}"
    mp.start_processes(
        _worker, args=(2, init, str(out), model_type), nprocs=2, join=True, start_method="spawn"
    )
    (logits, tokens), widths = torch.load(out, weights_only=False)
    assert tokens == expected_tokens
    for ours, ref in zip(logits, expected_logits, strict=True):
        torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)
    if moe is not None:  # every expert kept, each with half its intermediate width
        hidden, size = cast(Expert, moe.experts[0]).down.shape
        assert widths == [(hidden, size // 2)] * len(moe.experts)
