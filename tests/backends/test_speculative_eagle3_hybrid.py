"""EAGLE-3 heads on a hybrid target (tiny random Qwen3.5: gated DeltaNet between full-attention layers,
float32): the hybrid loop keeps the inputs of the head's layers (`Model.keep_layers`, hybrid_taps.py),
which equal transformers' own hidden states at those layers for every prompt row; with a random head the
greedy and seeded outputs equal plain decoding, drafts rejected part-way so the verify steps' per-position
states come back from the spec rows; without a head nothing is kept."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from localchat.backends.fake import FakeTokenizer
from localchat.engine.config import EngineConfig
from localchat.engine.engine import LLMEngine
from localchat.engine.sampling_params import SamplingParams
from localchat.engine.speculative import SpeculativeConfig
from localchat.weights.bundle import ModelBundle
from tests.backends.test_qwen3_next import tiny_qwen3_5
from tests.backends.test_speculative_eagle3 import random_head, write_head
from tests.helpers.fake_engine import drain
from tests.helpers.torch_models import bundle_from_hf, fp32_runner

VOCAB = 259  # the helpers' head vocabulary (test_speculative_torch.MODEL_VOCAB)


@pytest.fixture(scope="module")
def hf() -> Any:
    return tiny_qwen3_5(seed=4, vocab_size=VOCAB)


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_head(tmp_path_factory.mktemp("head") / "head", random_head(seed=3))


def engine(target: ModelBundle, head: Path | None) -> LLMEngine:
    runner = fp32_runner(target)
    proposer = runner.eagle3_proposer(str(head), "tiny", VOCAB) if head else None
    spec = SpeculativeConfig("eagle" if head else "off", num_tokens=3, max_batch=4)
    cfg = EngineConfig(kv_cache_mib=8, block_size=4, speculative=spec)
    return LLMEngine(
        runner, FakeTokenizer(), cfg, eos_token_ids=[], model_max_len=256, proposer=proposer, vocab_size=VOCAB
    )


def run(eng: LLMEngine, params: SamplingParams) -> list[list[int]]:
    rng = np.random.default_rng(5)
    ids = [eng.add_request([int(t) for t in rng.integers(3, VOCAB, size=n)], params) for n in (19, 27)]
    got: dict[str, list[int]] = {r: [] for r in ids}
    for out in drain(eng):
        got[out.req_id] += out.new_token_ids
    return [got[r] for r in ids]


def test_the_kept_layer_inputs_equal_transformers_hidden_states(hf: Any, head: Path) -> None:
    eng = engine(bundle_from_hf(hf), head)
    runner: Any = eng.runner
    taps = runner.hidden_taps
    filed: list[tuple[np.ndarray, torch.Tensor]] = []
    sink = taps.sink

    def record(batch: Any, aux: torch.Tensor) -> None:
        filed.append((np.asarray(batch.positions).copy(), aux.clone()))
        sink(batch, aux)

    taps.sink = record
    prompt = [int(t) for t in np.random.default_rng(8).integers(3, VOCAB, size=23)]
    eng.add_request(prompt, SamplingParams(max_tokens=1, temperature=0.0))
    list(drain(eng))
    # the prompt's chunks (a hybrid prefill stops at block boundaries for its state checkpoints)
    positions = np.concatenate([p for p, _ in filed])[: len(prompt)]
    aux = torch.cat([a for _, a in filed])[: len(prompt)]
    assert list(positions) == list(range(len(prompt))) and len(filed) >= 2
    with torch.no_grad():
        states = hf.model(torch.tensor([prompt]), output_hidden_states=True).hidden_states
    layers = taps.layers
    want = torch.cat([states[i][0] for i in layers], dim=-1)
    assert (aux - want).abs().max().item() < 2e-3  # values of size ~20; another layer is off by units


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_random_head_output_equals_plain_decoding(hf: Any, head: Path, temperature: float) -> None:
    target = bundle_from_hf(hf)
    params = SamplingParams(max_tokens=24, temperature=temperature, seed=3)
    plain_engine = engine(target, None)
    assert plain_engine.runner.model.keep_layers == frozenset()  # type: ignore[attr-defined]
    plain = run(plain_engine, params)
    eng = engine(target, head)
    assert eng.speculation_note == "" and eng.scheduler.spec_rows is not None
    assert run(eng, params) == plain
    assert eng.spec_draft_tokens > 0 and eng.scheduler.spec_rows.fixups_total > 0
