"""Qwen3.5 (gated DeltaNet + gated full attention) on the torch runner against transformers' reference,
float32, tiny random weights: prompt logits (two DeltaNet chunks), chunked prefill == one shot, ragged
batched decode with a preemption == transformers' greedy generate, and the kernels' two forms agree."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models
from transformers import Qwen3_5Config, Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration, Qwen3_5TextConfig

from localchat.backends.torch.gated_deltanet import delta_rule_chunked, delta_rule_step
from localchat.backends.torch.runner import TorchRunner
from localchat.weights.loader import load_model
from tests.helpers.hybrid_parity import HybridDriver, assert_decode_matches_generate, assert_prefill_matches
from tests.helpers.torch_models import bundle_from_hf, fp32_runner

TINY = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,  # two value heads per key head, as in the released models
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4,
    "full_attention_interval": 2,
    "max_position_embeddings": 512,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    "tie_word_embeddings": False,
}
# float32 sums in another order: most logits (size ~8) agree to ~1e-5, but the in-chunk triangular solve
# amplifies rounding at a few tokens (up to ~1.2e-3 seen, depending on which attention path ran). A wrong
# state (not continued, shared, or not reset) is off by whole units.
TOL = 3e-3
MEAN_TOL = 5e-5


def close_to(ours: torch.Tensor, ref: torch.Tensor) -> bool:
    err = (ours.cpu().float() - ref).abs()
    return err.max().item() < TOL and err.mean().item() < MEAN_TOL


PROMPT = [int(t) for t in np.random.default_rng(1).integers(1, 256, size=70)]  # 70: two 64-token chunks


def tiny_qwen3_5(seed: int = 0, **overrides: object) -> Qwen3_5ForCausalLM:
    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**{**TINY, **overrides})).float().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("A_log") or name.endswith("dt_bias"):
                continue  # transformers' init: decays spread over (0.01, 16)
            param.copy_(0.25 * torch.randn_like(param))
    return model


@pytest.fixture(scope="module")
def hf() -> Qwen3_5ForCausalLM:
    return tiny_qwen3_5()


@pytest.fixture(scope="module")
def runner(hf: Qwen3_5ForCausalLM) -> TorchRunner:
    r = fp32_runner(bundle_from_hf(hf))
    r.initialize_state_cache(4)
    return r


def test_prompt_logits_match_transformers(hf: Qwen3_5ForCausalLM, runner: TorchRunner) -> None:
    assert runner.model.num_kv_layers == 2  # type: ignore[attr-defined]
    assert runner.kv_cache_spec.num_layers == 2  # K/V only for the full-attention layers
    assert_prefill_matches(hf, runner, PROMPT, tol=TOL, mean_tol=MEAN_TOL)


def test_chunked_prefill_continues_from_the_state_the_last_chunk_left(
    hf: Qwen3_5ForCausalLM, runner: TorchRunner
) -> None:
    chunks = (5, 1, 30, 34)  # a one-token chunk takes the decode path mid-prompt
    assert_prefill_matches(hf, runner, PROMPT, chunks, tol=TOL, mean_tol=MEAN_TOL)


def test_ragged_batched_decode_with_a_preemption_matches_generate(
    hf: Qwen3_5ForCausalLM, runner: TorchRunner
) -> None:
    prompts = {"a": PROMPT[:9], "b": PROMPT, "c": PROMPT[30:33]}
    # "b" comes back as a 74-token prefill next to two decode rows
    assert_decode_matches_generate(hf, runner, prompts, 8, preempt=("b", 4))


def test_recurrent_form_equals_chunked_form() -> None:
    torch.manual_seed(0)
    length, heads, dk, dv = 37, 3, 8, 5
    q = torch.nn.functional.normalize(torch.randn(length, heads, dk), dim=-1) * dk**-0.5
    k = torch.nn.functional.normalize(torch.randn(length, heads, dk), dim=-1)
    v, g = torch.randn(length, heads, dv), -torch.rand(length, heads)
    beta, state = torch.rand(length, heads), torch.randn(heads, dk, dv)
    chunked, final = delta_rule_chunked(q, k, v, g, beta, state, chunk=16)
    s, steps = state[None], []
    for t in range(length):
        o, s = delta_rule_step(q[t : t + 1], k[t : t + 1], v[t : t + 1], g[t : t + 1], beta[t : t + 1], s)
        steps.append(o)
    assert torch.allclose(chunked, torch.cat(steps), atol=1e-5)
    assert torch.allclose(final, s[0], atol=1e-5)


def test_qwen3_5_checkpoint_folder_loads_its_text_model(tmp_path: Path, hf: Qwen3_5ForCausalLM) -> None:
    hf.save_pretrained(tmp_path)
    vocab = {f"t{i}": i for i in range(256)}
    (tmp_path / "tokenizer.json").write_text(Tokenizer(models.WordLevel(vocab, unk_token="t0")).to_str())
    bundle = load_model(tmp_path)
    assert bundle.config.model_type == "qwen3_5_text"
    assert bundle.config.extra["layer_types"] == ["linear_attention", "full_attention"] * 2
    r = fp32_runner(bundle)
    spec = r.state_cache_spec
    assert spec is not None and spec.num_layers == 2
    # conv window 3 x (2*32 + 32) float32 + recurrent 4 x 16 x 8 float32, per linear layer
    assert spec.bytes_per_slot == 2 * (3 * 96 * 4 + 4 * 16 * 8 * 4)
    r.initialize_state_cache(2)
    assert_prefill_matches(hf, r, PROMPT[:20], tol=TOL, mean_tol=MEAN_TOL)


def test_published_qwen3_5_wrapper_runs_its_text_model(tmp_path: Path) -> None:
    """Qwen3.5 ships as Qwen3_5ForConditionalGeneration: text LM under model.language_model, a vision
    tower under model.visual (skipped); text-only logits match the wrapper's own (its 3-stream RoPE
    is plain RoPE when every stream is the token index)."""
    vision = {"depth": 1, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64, "out_hidden_size": 64}
    torch.manual_seed(0)
    hf = Qwen3_5ForConditionalGeneration(Qwen3_5Config(text_config=dict(TINY), vision_config=vision)).eval()
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if not (name.endswith("A_log") or name.endswith("dt_bias")):
                param.copy_(0.25 * torch.randn_like(param))
    hf.save_pretrained(tmp_path)
    vocab = {f"t{i}": i for i in range(256)}
    (tmp_path / "tokenizer.json").write_text(Tokenizer(models.WordLevel(vocab, unk_token="t0")).to_str())
    bundle = load_model(tmp_path)
    assert bundle.config.model_type == "qwen3_5_text"
    assert not any("visual" in w.name for w in bundle.iter_weights())
    runner = fp32_runner(bundle)
    runner.initialize_state_cache(1)
    driver = HybridDriver(runner)
    driver.add("a", PROMPT[:20])
    _, logits = driver.step_logits(every_token=True)
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor([PROMPT[:20]])).logits[0].float()
    assert close_to(logits, ref)
