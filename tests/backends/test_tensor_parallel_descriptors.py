"""Nothing of a `--pp` runner with steps in flight outlives its shutdown: its results thread ends and
its process groups are let go at once, not at the next full garbage collection (the runner sits in
reference cycles), so many runners in one process (a test session) do not pile up descriptors. The
`--tp` runner's side: test_tensor_parallel.py's spawned-worker test."""

from __future__ import annotations

import functools
import os
import threading
from typing import Any, cast

import pytest
import torch

from localchat.backends.fake import FakeTokenizer
from localchat.backends.torch.parallel.driver import ParallelRunner
from localchat.engine.engine import LLMEngine
from localchat.engine.sampling_params import SamplingParams
from tests.backends import test_pipeline_parallel as plain
from tests.backends.test_pipeline_in_flight import config
from tests.helpers.torch_models import exact_weights


def _open_descriptors() -> list[str]:
    return sorted(os.listdir("/proc/self/fd"), key=int)


def _serve_two_requests() -> None:
    load = functools.partial(plain.family_bundle, "llama")
    with exact_weights():
        ranks = ParallelRunner(load(), plain.PP2, load=load)
    try:
        engine = LLMEngine(
            cast(Any, ranks), FakeTokenizer(), config(None), eos_token_ids=[2], model_max_len=1024
        )
        for prompt in ([5, 6, 7, 8], [9, 10]):
            engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
        while engine.has_unfinished:
            engine.step()
        assert ranks._inbox is not None  # the steps went in flight: the results thread ran
    finally:
        ranks.shutdown()
    assert ranks.exit_codes == [0]


@pytest.mark.slow  # spawns gloo ranks: out of the fast tier, still in CI
def test_a_pipeline_runner_leaves_no_descriptor_or_thread_behind() -> None:
    torch.set_num_threads(1)
    _serve_two_requests()  # the first start opens what stays for the process (spawn's resource tracker)
    before = _open_descriptors()
    _serve_two_requests()  # 16 more before (the results group's 13 until a full gc, 2 spawn pipes, 1)
    assert not any(t.name.startswith("localchat-") for t in threading.enumerate())
    assert _open_descriptors() == before
