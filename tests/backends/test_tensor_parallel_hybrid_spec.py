"""Speculative decoding on a hybrid model under tensor parallelism (TP=2, gloo, 2 processes on CPU):
every rank keeps its share of each verify position's state in the spec rows (`BatchInputs.state_keep`)
and applies the copy back with the step's `state_copies`, so n-gram speculation with drafts rejected
gives one device's plain greedy tokens and logprobs (1e-3)."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch

from localchat.backends.torch.parallel.driver import ParallelRunner
from tests.backends.test_hybrid_spec_torch import assert_same, engine, run
from tests.backends.test_pipeline_hybrid import hybrid_bundle
from tests.helpers.torch_models import exact_weights
from tests.helpers.tp_parity import TP2


@pytest.mark.slow  # spawns gloo ranks
def test_tp2_ngram_equals_plain_decoding_on_one_device() -> None:
    torch.set_num_threads(1)
    load = functools.partial(hybrid_bundle, "qwen3_5")
    plain = run(engine(load(), "off"))
    with exact_weights():
        sharded: Any = ParallelRunner(load(), TP2, load=load)
    try:
        eng = engine(load(), "ngram", make_runner=lambda bundle: sharded)
        assert eng.speculation_note == "" and eng.scheduler.spec_rows is not None
        assert_same(run(eng), plain)
        assert eng.spec_draft_tokens > 0 and eng.scheduler.spec_rows.fixups_total > 0
    finally:
        sharded.shutdown()
