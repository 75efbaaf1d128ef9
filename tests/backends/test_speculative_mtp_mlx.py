"""`--speculative mtp` on the MLX runner (CPU, float32): the native multi-token-prediction head of a tiny
random Qwen3.5 / Qwen3-Next with random `mtp.*` tensors, the same folder data the torch tests use
(test_speculative_mtp.py).

- Every draft the MLX proposer makes in a real engine run equals the plain-torch reference of the head
  (transformers' own decoder layer as the MTP layer), and draft 1's logits match it.
- Output equals plain MLX decoding token for token, greedy and seeded, with drafts made and rejected.
- A model without the head is refused with a typed error; the runner hands out nothing until a head is
  attached.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("mlx.core")

from localchat.backends.fake import FakeTokenizer
from localchat.backends.mlx.mtp_head import MtpLoadError
from localchat.backends.mlx.mtp_proposer import attach_mtp
from localchat.engine.config import EngineConfig
from localchat.engine.engine import LLMEngine
from localchat.engine.sampling_params import SamplingParams
from localchat.engine.speculative import SpeculativeConfig
from localchat.weights.bundle import ModelBundle
from tests.backends.test_qwen3_next import tiny_qwen3_5
from tests.backends.test_speculative_mtp import (
    GREEDY,
    SEEDED,
    VOCAB,
    Reference,
    bundle,
    check_bigram_drafts_kept,
    check_random_head_equals_plain,
    mtp_tensors,
    prompts,
    run,
    save,
    tiny_qwen3_next,
)
from tests.helpers.mtp import last_logits, record_drafts
from tests.helpers.parity import mlx_runner

pytestmark = pytest.mark.mlx


def engine(target: ModelBundle, method: str, k: int = 3) -> LLMEngine:
    runner = mlx_runner(target)
    proposer = attach_mtp(runner, target.iter_weights(), "tiny", VOCAB) if method == "mtp" else None
    spec = SpeculativeConfig(method, num_tokens=k, max_batch=4)
    cfg = EngineConfig(kv_cache_mib=8, block_size=4, speculative=spec)
    return LLMEngine(
        runner, FakeTokenizer(), cfg, eos_token_ids=[], model_max_len=256, proposer=proposer, vocab_size=VOCAB
    )


@pytest.fixture(scope="module")
def hf() -> Any:
    return tiny_qwen3_5(seed=2)


@pytest.mark.parametrize("kind", ["qwen3_5", "qwen3_next"])
def test_drafts_and_logits_equal_the_reference_head(hf: Any, kind: str) -> None:
    hf = hf if kind == "qwen3_5" else tiny_qwen3_next()  # Qwen3-Next: the MTP layer's MLP is a MoE
    mtp = mtp_tensors(hf, seed=1)
    eng = engine(bundle(hf, mtp), "mtp")
    proposer: Any = eng.scheduler.proposer
    seen = record_drafts(proposer, lambda p, r: np.array(last_logits(p, r)))
    run(eng, GREEDY)
    assert len(seen) >= 8
    reference = Reference(hf, mtp)
    for tokens, computed, k, drafts, logits in seen:
        want, want_logits = reference.drafts(tokens, computed, k)
        assert drafts == want
        assert np.abs(logits - want_logits.numpy()).max() < 2e-3
    # The hidden state before the target's final norm gives other logits: the test sees the difference.
    wrong = Reference(hf, mtp, hidden_before_norm=True)
    assert max(np.abs(wrong.drafts(t, c, k)[1].numpy() - got).max() for t, c, k, _, got in seen) > 0.05


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_random_head_output_equals_plain_mlx_decoding(hf: Any, params: SamplingParams) -> None:
    check_random_head_equals_plain(engine, hf, params)


def test_a_model_without_the_head_is_refused(hf: Any) -> None:
    runner = mlx_runner(bundle(hf, mtp_tensors(hf, seed=1)))  # the mtp.* names do not trip the model's load
    assert runner.hidden_sink is None  # nothing is handed out until a head is attached
    empty = bundle(hf, {})
    with pytest.raises(MtpLoadError, match="no multi-token-prediction head"):
        attach_mtp(mlx_runner(empty), empty.iter_weights(), "tiny", VOCAB)


def test_llm_api_mtp_and_auto_on_a_qwen3_next_folder(tmp_path: Path) -> None:
    """A saved Qwen3-Next folder with a MoE MTP layer on --backend mlx: `mtp` and `auto` (which picks the
    head) give plain greedy's tokens; the folder without the head: `mtp` is refused, `auto` picks as before."""
    from localchat import LLM

    hf = tiny_qwen3_next()
    with_head = save(hf, tmp_path / "with", mtp_tensors(hf, seed=3))
    without = save(hf, tmp_path / "without", {})
    prompt = prompts()[0]
    params = SamplingParams(max_tokens=16, temperature=0.0)
    options: dict[str, Any] = {"backend": "mlx", "device": "cpu", "dtype": "float32"}
    plain = LLM(with_head, speculative="off", **options).generate([prompt], params)
    for method in ("mtp", "auto"):
        llm = LLM(with_head, speculative=method, **options)
        assert llm.engine.config.speculative.method == "mtp", method
        assert llm.generate([prompt], params)[0].token_ids == plain[0].token_ids
        assert llm.engine.spec_draft_tokens > 0
    with pytest.raises(MtpLoadError, match="no multi-token-prediction head"):
        LLM(without, speculative="mtp", **options)
    assert LLM(without, speculative="auto", **options).engine.config.speculative.method != "mtp"


# Seeded at 0.3: the tiny target's distributions are nearly flat at 0.9, where 0 of 18 drafts were kept
# on MLX (3 of 23 on torch, another random stream): too few to tell a kept draft from luck.
COOL = SamplingParams(max_tokens=24, temperature=0.3, seed=11)


@pytest.mark.parametrize("params", [GREEDY, COOL], ids=["greedy", "seeded"])
def test_head_that_agrees_with_a_bigram_target_has_its_drafts_kept(hf: Any, params: SamplingParams) -> None:
    """The torch tests' bigram target and agreeing head: every greedy draft is kept, so the tokens and
    positions the MLX proposer feeds line up with the target's (seeded: 14 of 31 kept)."""
    check_bigram_drafts_kept(engine, hf, params)


@pytest.mark.slow  # runs llama.cpp's converter twice per family
@pytest.mark.parametrize("family", ["qwen35", "qwen3next"])
def test_gguf_nextn_block_on_mlx(tmp_path: Path, family: str) -> None:
    """llama.cpp's converter writes the head as an extra `nextn` block: from the f32 file the MLX head's
    drafts equal the reference's; from the Q8_0 file (blocks kept quantized) output equals plain MLX."""
    from localchat import LLM
    from tests.backends.test_speculative_mtp_gguf import FAMILIES, mtp_ggufs
    from tests.helpers.mtp import recorded

    hf_model: Any = FAMILIES[family]()
    mtp, f32, q8 = mtp_ggufs(hf_model, tmp_path)
    rng = np.random.default_rng(1)
    prompt = [int(t) for t in rng.integers(3, 290, size=21)]
    params = SamplingParams(max_tokens=14, temperature=0.0)
    options: dict[str, Any] = {"backend": "mlx", "device": "cpu", "dtype": "float32"}
    reference = Reference(hf_model, mtp)
    for path in (f32, q8):
        plain = LLM(path, speculative="off", **options).generate([prompt], params)
        llm = LLM(path, speculative="auto", **options)  # auto: the file has a head
        assert llm.engine.config.speculative.method == "mtp"
        seen = recorded(llm.engine.scheduler.proposer)
        assert llm.generate([prompt], params)[0].token_ids == plain[0].token_ids
        assert seen
        if path == f32:
            for tokens, computed, k, drafts in seen:
                assert drafts == reference.drafts(tokens, computed, k)[0]
