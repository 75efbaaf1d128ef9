"""`--speculative mtp` on a hybrid target under prefix caching and preemption: the agent waves of
test_hybrid_spec_prefix_torch.py (a shared system prompt and tool sets, long messages, next turns,
regenerated answers, new chats) in a 1 MiB pool, on the tiny Qwen3.5 bigram target with an MTP head that
agrees with it but for noise (drafts kept part-way), equal cold runs token for token. Prefix-cache hits
leave positions the head never saw (its cache simply lacks them) and preempted sequences come back
recomputed: the head's rows for them are replaced, and the output stays exact."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from localchat.backends.fake import FakeTokenizer
from localchat.backends.torch.mtp_proposer import attach_mtp
from localchat.engine.config import EngineConfig
from localchat.engine.engine import LLMEngine
from localchat.engine.speculative import SpeculativeConfig
from localchat.weights.bundle import ModelBundle
from tests.backends.test_hybrid_spec_prefix_torch import BLOCK, first_wave, run_all, second_wave
from tests.backends.test_qwen3_next import tiny_qwen3_5
from tests.backends.test_speculative_mtp import VOCAB, bigram, bundle
from tests.helpers.torch_models import fp32_runner

# Builds a backend's runner for a bundle, and attaches that backend's MTP head to it: the MLX test runs
# the same check through its own pair.
RunnerFor = Callable[[ModelBundle], Any]
AttachMtp = Callable[[Any, Any, str, int], Any]


def engine(
    target: ModelBundle, method: str, runner_for: RunnerFor, attach: AttachMtp, **config: Any
) -> LLMEngine:
    runner = runner_for(target)
    proposer = attach(runner, target.iter_weights(), "tiny", VOCAB) if method == "mtp" else None
    spec = SpeculativeConfig(method, num_tokens=4, max_batch=4)
    cfg = EngineConfig(**{"kv_cache_mib": 1, "block_size": BLOCK, "speculative": spec, **config})
    return LLMEngine(
        runner,
        FakeTokenizer(),
        cfg,
        eos_token_ids=[],
        model_max_len=4096,
        proposer=proposer,
        vocab_size=VOCAB,
    )


def test_agent_waves_with_an_mtp_head_under_preemption_equal_cold_runs() -> None:
    check_agent_waves(fp32_runner, attach_mtp)


def check_agent_waves(runner_for: RunnerFor, attach: AttachMtp) -> None:
    """The agent waves through `runner_for`'s backend with its MTP head equal its cold runs (see above)."""
    target_hf, mtp = bigram(tiny_qwen3_5(seed=2))
    hidden = target_hf.config.hidden_size
    noise = torch.randn(hidden, 2 * hidden, generator=torch.Generator().manual_seed(9))
    mtp["mtp.fc.weight"] = mtp["mtp.fc.weight"] + 0.02 * noise  # a third of the drafts wrong: copies back
    target = bundle(target_hf, mtp)
    cold = engine(target, "off", runner_for, attach, enable_prefix_caching=False)
    first = first_wave()
    expected = {r: run_all(cold, {r: p})[r] for r, p in first.items()}
    eng = engine(
        target, "mtp", runner_for, attach, max_num_seqs=4, state_checkpoints=4, prefill_chunk_size=48
    )
    got = run_all(eng, first)
    second = second_wave(first, got)
    got |= run_all(eng, second)
    expected |= {r: run_all(cold, {r: p})[r] for r, p in second.items()}
    for req_id in {**first, **second}:
        tokens, logprobs = got[req_id]
        assert tokens == expected[req_id][0], req_id
        assert np.abs(np.asarray(logprobs) - np.asarray(expected[req_id][1])).max() < 1e-3, req_id
    spec_rows = eng.scheduler.spec_rows
    assert spec_rows is not None and spec_rows.fixups_total > 0
    assert eng.scheduler.num_preemptions > 0
    assert eng.stats().state_checkpoint_restores_total >= 4
    assert 0.3 * eng.spec_draft_tokens < eng.spec_accepted_tokens < eng.spec_draft_tokens  # 224 of 336
