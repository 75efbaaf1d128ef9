"""GLM-4.5-style MoE (glm4_moe) against transformers (fp32), torch runner: q/k/v biases without an o bias,
RoPE on half of each head, the optional q/k norm, a dense first layer then DeepSeek-V3's sigmoid router
(selection bias, grouped top-k, scaled weights) with a shared expert; the checkpoint's multi-token-
prediction layer is dropped at load.

The parity suite's paged-cache checks run here on this module's own `pair` fixture."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from localchat.arch.deepseek import RouterSpec
from localchat.backends.torch.runner import TorchRunner
from localchat.weights.config import ModelConfig
from localchat.weights.loader import load_model
from tests.backends.test_torch_parity import (  # noqa: F401  (collected here, on this module's `pair`)
    PROMPT,
    _tiny_tokenizer_json,
    assert_close,
    hf_logits,
    test_batch_of_different_lengths,
    test_chunked_prefill,
    test_greedy_generation_matches_generate,
    test_mixed_prefill_and_decode,
    test_prefill_over_cached_prefix,
    test_prompt_and_greedy_decode_logits,
)
from tests.helpers.torch_batch import PagedDriver
from tests.helpers.torch_models import bundle_from_hf, fp32_runner, tiny_hf_model

MOE: dict[str, Any] = {
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
}
VARIANTS: dict[str, dict[str, Any]] = {
    # GLM-4.5's options: biases, q/k norm, grouped routing (2 groups, 1 kept), scaled weights.
    "glm4_moe": {
        **MOE,
        "attention_bias": True,
        "use_qk_norm": True,
        "n_group": 2,
        "topk_group": 1,
        "routed_scaling_factor": 2.5,
    },
    # No q/k norm nor biases, raw top-k weights, a quarter of each head turning.
    "glm4_moe-plain": {**MOE, "norm_topk_prob": False, "partial_rotary_factor": 0.25},
}


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request: pytest.FixtureRequest) -> tuple[torch.nn.Module, TorchRunner]:
    hf = tiny_hf_model("glm4_moe", **VARIANTS[request.param])
    return hf, fp32_runner(bundle_from_hf(hf))


def test_config_reads_partial_rotary_and_router() -> None:
    d = tiny_hf_model("glm4_moe", **VARIANTS["glm4_moe"]).config.to_dict()
    config = ModelConfig.from_hf_dict(d)
    assert (config.head_dim, config.rotary_dim, config.attention_bias) == (16, 8, True)
    router = RouterSpec.from_config(config)
    assert (router.sigmoid, router.groups, router.groups_used, router.scale) == (True, 2, 1, 2.5)


def test_hub_folder_with_an_mtp_layer(tmp_path: Path) -> None:
    """save_pretrained's per-expert names and the selection bias buffer; a multi-token-prediction layer
    after the last one (GLM-4.5 ships one) is skipped rather than refused."""
    from safetensors.torch import load_file, save_file

    hf = tiny_hf_model("glm4_moe", **VARIANTS["glm4_moe"])
    hf.save_pretrained(tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    assert "model.layers.1.mlp.experts.3.gate_proj.weight" in state
    state |= {k.replace("layers.1.", "layers.2."): v.clone() for k, v in state.items() if ".layers.1." in k}
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    (tmp_path / "tokenizer.json").write_text(_tiny_tokenizer_json())
    driver = PagedDriver(fp32_runner(load_model(tmp_path)))
    driver.add("a", PROMPT * 2)
    _, logits = driver.step_logits(every_token=True)
    assert_close(logits, hf_logits(hf, PROMPT * 2))
