"""longrope (Phi-3 / Phi-4-mini): our numpy tables against transformers' own rope init function, and the
per-position choice of factor lists (localchat/arch/rope.py) against transformers' cached generation
across the original pretraining length."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import Phi3Config
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from localchat.arch.rope import rope_inv_freq, rope_long_inv_freq
from localchat.weights.config import ModelConfig
from tests.helpers.torch_batch import PagedDriver
from tests.helpers.torch_models import PHI3_LONGROPE, bundle_from_hf, fp32_runner, tiny_hf_model

# float32 pow may round an entry one ulp apart from torch's: far below the 1e-4 logit bar.


def _phi3_128k_like() -> Phi3Config:
    """Phi-3-mini-128k's shape: head 96, original 4096 -> 131072, 48 factors per list."""
    rng = np.random.default_rng(0)
    short = (1.0 + rng.random(48)).round(4).tolist()
    long = (1.0 + 40 * rng.random(48)).round(4).tolist()
    scaling = {"type": "longrope", "short_factor": short, "long_factor": long}
    return Phi3Config(
        hidden_size=3072,
        num_attention_heads=32,
        max_position_embeddings=131072,
        original_max_position_embeddings=4096,
        rope_scaling=scaling,
    )


def test_tables_match_transformers_rope_init() -> None:
    hf_config = _phi3_128k_like()
    config = ModelConfig.from_hf_dict(hf_config.to_dict())
    init = ROPE_INIT_FUNCTIONS["longrope"]
    short_ref, factor_ref = init(hf_config, None, seq_len=None)
    long_ref, _ = init(hf_config, None, seq_len=4097)
    short, factor = rope_inv_freq(config)
    long = rope_long_inv_freq(config)
    assert long is not None and long[1] == 4096
    np.testing.assert_allclose(short, short_ref.numpy(), rtol=1e-6)
    np.testing.assert_allclose(long[0], long_ref.numpy(), rtol=1e-6)
    assert not np.allclose(short, long[0])  # the two lists really differ
    assert factor == pytest.approx(factor_ref, rel=1e-12) and factor > 1.0


def test_early_phi3_su_name_is_longrope() -> None:
    """Phi-3's first config.json files call it `su` in an old-style top-level `rope_scaling`."""
    d = _phi3_128k_like().to_dict()
    params = d.pop("rope_parameters")
    d["rope_scaling"] = {
        "type": "su",
        "short_factor": params["short_factor"],
        "long_factor": params["long_factor"],
    }
    d["rope_theta"] = params["rope_theta"]
    reference = ModelConfig.from_hf_dict(_phi3_128k_like().to_dict())
    config = ModelConfig.from_hf_dict(d)
    np.testing.assert_array_equal(rope_inv_freq(config)[0], rope_inv_freq(reference)[0])
    assert rope_inv_freq(config)[1] == rope_inv_freq(reference)[1]
    long, long_reference = rope_long_inv_freq(config), rope_long_inv_freq(reference)
    assert long is not None and long_reference is not None and long[1] == 4096
    np.testing.assert_array_equal(long[0], long_reference[0])


def test_partial_rotary_tables_match_transformers_rope_init() -> None:
    hf = tiny_hf_model(
        "phi3", partial_rotary_factor=0.75, original_max_position_embeddings=64, rope_parameters=PHI3_LONGROPE
    )
    config = ModelConfig.from_hf_dict(hf.config.to_dict())
    assert config.rotary_dim == 12
    init = ROPE_INIT_FUNCTIONS["longrope"]
    long = rope_long_inv_freq(config)
    assert long is not None
    np.testing.assert_allclose(
        rope_inv_freq(config)[0], init(hf.config, None, seq_len=None)[0].numpy(), rtol=1e-6
    )
    np.testing.assert_allclose(long[0], init(hf.config, None, seq_len=65)[0].numpy(), rtol=1e-6)


def test_other_rope_types_have_no_long_table() -> None:
    hf = tiny_hf_model("phi3")
    assert rope_long_inv_freq(ModelConfig.from_hf_dict(hf.config.to_dict())) is None


def _tiny_longrope(original: int) -> torch.nn.Module:
    return tiny_hf_model(
        "phi3",
        partial_rotary_factor=0.75,
        original_max_position_embeddings=original,
        rope_parameters=PHI3_LONGROPE,
    )


def _prompt_logits(runner: object, tokens: list[int]) -> torch.Tensor:
    driver = PagedDriver(runner)  # type: ignore[arg-type]
    driver.add("a", tokens)
    _, logits = driver.step_logits(every_token=True)
    return (logits if isinstance(logits, torch.Tensor) else torch.from_numpy(np.array(logits))).float().cpu()


def _hf_logits(hf: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0].float()


def _runners(hf: torch.nn.Module) -> list[object]:
    """The torch runner, and the MLX one where mlx imports."""
    runners: list[object] = [fp32_runner(bundle_from_hf(hf))]
    try:
        from localchat.backends import RunnerOptions
        from localchat.backends.mlx.runner import MLXRunner
    except ImportError:
        return runners
    return [*runners, MLXRunner(bundle_from_hf(hf), RunnerOptions(device="cpu", dtype="float32", seed=0))]


LONG_PROMPT = [(7 * i + 3) % 256 for i in range(24)]  # 24 tokens: past the original length of 16


def test_context_past_the_original_length_uses_the_long_factors() -> None:
    """Served with a 64-token context, a 24-token prompt matches transformers, which turns a sequence past
    the original length (16) with the long factors throughout."""
    hf = _tiny_longrope(16)
    ref = _hf_logits(hf, LONG_PROMPT)
    for runner in _runners(hf):
        runner.prepare_decode_graphs(4, 64)  # type: ignore[attr-defined]  # the engine's hook
        assert (_prompt_logits(runner, LONG_PROMPT) - ref).abs().max().item() < 1e-4


def test_context_within_the_original_length_keeps_the_short_factors() -> None:
    hf = _tiny_longrope(16)
    prompt = LONG_PROMPT[:12]
    ref = _hf_logits(hf, prompt)
    for runner in _runners(hf):
        runner.prepare_decode_graphs(4, 16)  # type: ignore[attr-defined]
        assert (_prompt_logits(runner, prompt) - ref).abs().max().item() < 1e-4
        # The long table would not match: the choice is what this test checks.
        runner.prepare_decode_graphs(4, 64)  # type: ignore[attr-defined]
        assert (_prompt_logits(runner, prompt) - ref).abs().max().item() > 1e-3
