"""Phi-3 as llama.cpp writes it (arch `phi3`: fused `attn_qkv`, gate|up in `ffn_up`, longrope factor
lists as `rope_factors_long/short` tensors, rotary dims in `rope.dimension_count`): a tiny GGUF loads and
matches transformers on the very weights we run (dequantized)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from localchat.backends import RunnerOptions
from localchat.weights.bundle import ModelBundle
from localchat.weights.loader import load_model
from tests.helpers.tiny_gguf import TINY_VOCAB_SIZE, write_tiny_gguf
from tests.helpers.torch_batch import PagedDriver
from tests.helpers.torch_models import VARIANTS, fp32_runner, tiny_hf_model

PROMPT = [5, 17, 99, 3, 250, 42, 7, 7, 81, 130, 64]


@pytest.mark.parametrize("variant", ["phi3", "phi3-partial-longrope"])
def test_phi3_gguf_matches_transformers_on_dequantized_weights(tmp_path: Path, variant: str) -> None:
    model_type, overrides = VARIANTS[variant]
    hf = tiny_hf_model(model_type, **{**overrides, "vocab_size": TINY_VOCAB_SIZE})
    bundle = load_model(write_tiny_gguf(tmp_path / "tiny.gguf", hf, qtype="Q8_0", tokenizer_kind="gpt2"))
    config = bundle.config
    assert config.model_type == "phi3" and config.rotary_dim == hf.config.rope_parameters.get(
        "partial_rotary_factor", 1.0
    ) * (64 // 4)
    if "longrope" in variant:
        assert config.rope_scaling is not None
        assert config.rope_scaling["long_factor"] == pytest.approx(
            overrides["rope_parameters"]["long_factor"]
        )
        assert config.rope_scaling["short_factor"] == pytest.approx(
            overrides["rope_parameters"]["short_factor"]
        )
        assert config.rope_scaling["original_max_position_embeddings"] == 64
    weights = list(bundle.iter_weights())
    assert any(w.dtype == "Q8_0" for w in weights)
    state = {w.name: torch.tensor(w.dequantize()) for w in weights}
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    with torch.no_grad():
        ref = hf(torch.tensor([PROMPT * 2])).logits[0].float()
    for runner in _runners(bundle):
        driver = PagedDriver(runner)  # type: ignore[arg-type]
        driver.add("a", PROMPT * 2)
        _, logits = driver.step_logits(every_token=True)
        ours = logits if isinstance(logits, torch.Tensor) else torch.from_numpy(np.array(logits))
        assert (ours.float().cpu() - ref).abs().max().item() < 1e-4


def _runners(bundle: ModelBundle) -> list[object]:
    """The torch runner, and the MLX one (Q8_0 kept quantized there) where mlx imports."""
    runners: list[object] = [fp32_runner(bundle)]
    try:
        from localchat.backends.mlx.runner import MLXRunner
    except ImportError:
        return runners
    return [*runners, MLXRunner(bundle, RunnerOptions(device="cpu", dtype="float32", seed=0))]
