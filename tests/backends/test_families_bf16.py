"""The 2026 families at the CPU default dtype (bfloat16, the compiled kernels where the CPU has them): prompt
and decode steps track transformers' fp32 logits closely (cosine > 0.99), so nothing in their layers
assumes float32 (norm weights, scalars, padded heads, expert dispatch)."""

from __future__ import annotations

import pytest
import torch

from localchat.backends import RunnerOptions
from localchat.backends.torch.runner import TorchRunner
from tests.backends import test_gemma4, test_glm4_moe, test_llama4, test_mistral4, test_smollm3
from tests.helpers.torch_batch import PagedDriver
from tests.helpers.torch_models import bundle_from_hf, tiny_hf_model

PROMPT = [5, 17, 99, 3, 250, 42, 7, 7, 81, 130, 64] * 2
FAMILIES = {
    "smollm3": test_smollm3.VARIANTS["smollm3-sliding"],
    "gemma4_text": test_gemma4.VARIANTS["gemma4-per-layer-embeddings"],
    "mistral4": test_mistral4.VARIANTS["mistral4"],
    "glm4_moe": test_glm4_moe.VARIANTS["glm4_moe"],
    "llama4_text": test_llama4.VARIANTS["llama4"],
}


@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_bfloat16_tracks_the_fp32_reference(model_type: str) -> None:
    hf = tiny_hf_model(model_type, **FAMILIES[model_type])
    hf.config.output_hidden_states = model_type == "gemma4_text"  # see test_gemma4.tiny_gemma4
    runner = TorchRunner(bundle_from_hf(hf), RunnerOptions(device="cpu", dtype="bfloat16"))
    driver = PagedDriver(runner)
    driver.add("a", PROMPT)
    _, logits = driver.step_logits()
    for _ in range(4):
        with torch.no_grad():
            ref = hf(torch.tensor([driver.tokens("a")])).logits[0, -1].float()
        assert torch.nn.functional.cosine_similarity(logits[-1].float(), ref, dim=0) > 0.99
        driver.feed("a", int(ref.argmax()))
        _, logits = driver.step_logits()
