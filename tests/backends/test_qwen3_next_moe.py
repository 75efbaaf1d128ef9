"""Qwen3-Next and Qwen3.5-MoE (gated DeltaNet + gated attention, every MLP a sparse MoE with a
sigmoid-gated shared expert; Qwen3-Next's DeltaNet projections grouped per key head) on the torch runner
against transformers, float32, tiny random weights: prompt logits and greedy decode with chunked prefill,
from memory and from a saved folder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models
from transformers import (
    PreTrainedModel,
    Qwen3_5MoeForCausalLM,
    Qwen3_5MoeTextConfig,
    Qwen3NextConfig,
    Qwen3NextForCausalLM,
)

from localchat.weights.loader import load_model
from tests.backends.test_qwen3_next import PROMPT, TINY, HybridDriver, close_to
from tests.helpers.torch_models import bundle_from_hf, fp32_runner

MOE = {"num_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
MOE |= {"shared_expert_intermediate_size": 48}
FAMILIES = {
    "qwen3_next": (Qwen3NextForCausalLM, Qwen3NextConfig, {"norm_topk_prob": True, "decoder_sparse_step": 1}),
    "qwen3_5_moe_text": (Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig, {}),
}


def tiny_model(model_type: str) -> PreTrainedModel:
    cls, config_cls, extra = FAMILIES[model_type]
    torch.manual_seed(0)
    model = cls(config_cls(**TINY, **MOE, **extra)).float().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not (name.endswith("A_log") or name.endswith("dt_bias")):
                param.copy_(0.25 * torch.randn_like(param))
    return model


@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_moe_hybrid_logits_and_greedy_decode_match_transformers(tmp_path: Path, model_type: str) -> None:
    hf = tiny_model(model_type)
    hf.save_pretrained(tmp_path)
    vocab = {f"t{i}": i for i in range(256)}
    (tmp_path / "tokenizer.json").write_text(Tokenizer(models.WordLevel(vocab, unk_token="t0")).to_str())
    folder = load_model(tmp_path)
    assert folder.config.model_type == model_type
    names = {w.name for w in folder.iter_weights()}
    # Qwen3-Next's grouped layout on disk, split at load
    assert any("in_proj_qkvz" in n for n in names) == (model_type == "qwen3_next")
    with torch.no_grad():
        ref = hf(torch.tensor([PROMPT])).logits[0].float()
        generated = hf.generate(torch.tensor([PROMPT[:12]]), max_new_tokens=6, do_sample=False)
    for bundle in (folder, bundle_from_hf(hf)):
        runner = fp32_runner(bundle)
        runner.initialize_state_cache(2)
        driver = HybridDriver(runner)
        driver.add("a", PROMPT)
        rows = [driver.step_logits({"a": n}, every_token=True)[1].cpu() for n in (40, 30)]
        assert close_to(torch.cat(rows), ref)
        driver.add("b", PROMPT[:12])
        for _ in range(6):
            driver.step({"b": len(driver.tokens("b")) - driver.reqs["b"].num_computed})
        assert driver.tokens("b")[12:] == generated[0, 12:].tolist()
    assert np.isfinite(ref.numpy()).all()
