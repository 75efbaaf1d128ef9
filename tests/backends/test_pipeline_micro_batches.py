"""Micro-batches under `--pp`: a large step cut into groups of whole rows, each group run through the
stages in turn so they overlap. The groups' logits, in order, are the whole step's (rows are
independent: K/V blocks, state slots, pictures and M-RoPE columns are sliced with them), and PP=2 with
every multi-row step cut gives the one-device tokens and logits (a plain and a hybrid model)."""

from __future__ import annotations

import functools
from typing import cast

import numpy as np
import pytest
import torch

from localchat.backends.torch.parallel.driver import ParallelRunner
from localchat.backends.torch.parallel.micro_batches import micro_batches
from localchat.backends.torch.parallel.pipeline import PipelineStageRunner
from localchat.backends.torch.runner import TorchRunner
from localchat.weights.bundle import ModelBundle
from tests.backends import test_pipeline_hybrid as hybrid
from tests.backends import test_pipeline_parallel as plain
from tests.helpers.torch_batch import PagedDriver
from tests.helpers.torch_models import exact_weights, fp32_runner


def test_a_step_is_cut_into_whole_rows_of_about_equal_tokens() -> None:
    runner = fp32_runner(plain.family_bundle("llama"))
    driver = PagedDriver(runner, num_blocks=64, block_size=4)
    for req_id, size in (("a", 30), ("b", 3), ("c", 20), ("d", 9)):
        driver.add(req_id, [5 + i for i in range(size)])
    _, batch = driver.build()
    assert micro_batches(batch, 2, min_tokens=100) == [batch]  # 62 tokens: too few to cut
    assert micro_batches(batch, 4, min_tokens=40) == [batch]  # a group would have fewer than 40
    first, second = micro_batches(batch, 2, min_tokens=1)
    assert (first.req_ids, second.req_ids) == (["a"], ["b", "c", "d"])  # 30 | 32
    assert second.query_start_loc.tolist() == [0, 3, 23, 32] and second.logits_indices.tolist() == [2, 22, 31]
    assert np.array_equal(second.input_ids, batch.input_ids[30:]) and second.max_query_len == 20
    # At most 4: the cuts nearest 1/4, 2/4 and 3/4 of the tokens (rows start at 30, 33, 53) are 2.
    assert [p.req_ids for p in micro_batches(batch, 4, min_tokens=1)] == [["a"], ["b", "c"], ["d"]]
    # A hybrid verify step's per-token spec rows (BatchInputs.state_keep) are cut with their tokens.
    batch.state_keep = np.arange(batch.num_tokens, dtype=np.int64) + 100
    parts = micro_batches(batch, 4, min_tokens=1)
    assert np.concatenate([p.state_keep for p in parts if p.state_keep is not None]).tolist() == list(
        range(100, 100 + batch.num_tokens)
    )


def test_the_groups_logits_are_the_steps() -> None:
    """One device, every token's logits: the step whole, and its groups run one after the other."""
    bundle = plain.family_bundle("qwen3")
    whole, cut = fp32_runner(bundle), fp32_runner(bundle)
    results = []
    for runner, groups in ((whole, 1), (cut, 2)):
        driver = PagedDriver(runner, num_blocks=64, block_size=4)
        for req_id, prompt in plain.PROMPTS.items():
            driver.add(req_id, prompt)
        _out, batch = driver.build(every_token=True)
        with torch.inference_mode():
            parts = micro_batches(batch, groups, min_tokens=1)
            assert len(parts) == groups
            results.append(torch.cat([runner._logits(part) for part in parts]).float())
    torch.testing.assert_close(results[1], results[0], rtol=1e-5, atol=1e-5)


def cut_everything(load: functools.partial[ModelBundle]) -> ModelBundle:
    """The workers' loader: also cuts every multi-row step there (each rank must cut alike)."""
    PipelineStageRunner.micro_batch_tokens = 1
    return load()


@pytest.mark.parametrize(
    ("module", "name"), [(plain, "qwen3"), (hybrid, "qwen3_5")], ids=["qwen3", "qwen3_5-hybrid"]
)
@pytest.mark.slow  # spawns gloo ranks: out of the fast tier, still in CI
def test_pp2_with_micro_batches_matches_one_device(
    module: object, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.set_num_threads(1)
    monkeypatch.setattr(PipelineStageRunner, "micro_batch_tokens", 1)
    calls: list[int] = []
    original = micro_batches

    def counted(*args: object, **kwargs: object) -> object:
        parts = original(*args, **kwargs)  # type: ignore[arg-type]
        calls.append(len(parts))
        return parts

    monkeypatch.setattr("localchat.backends.torch.parallel.pipeline.micro_batches", counted)
    load = functools.partial(plain.family_bundle if module is plain else hybrid.hybrid_bundle, name)
    bundle = load()
    runner = None
    try:
        with exact_weights():
            runner = ParallelRunner(bundle, plain.PP2, load=functools.partial(cut_everything, load))
        if module is plain:
            plain_logits, plain_tokens = plain.ragged_then_decode(fp32_runner(bundle))
            logits, tokens = plain.ragged_then_decode(cast(TorchRunner, runner))
            assert tokens == plain_tokens
            for ours, ref in zip(logits, plain_logits, strict=True):
                torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
            assert plain.chunked_and_preempted(cast(TorchRunner, runner)) == plain.chunked_and_preempted(
                fp32_runner(bundle)
            )
        else:
            hybrid.assert_same(cast(TorchRunner, runner), bundle)
        assert max(calls) == 2  # steps were cut in two (stage 0 of 2)
    finally:
        if runner is not None:
            runner.shutdown()
