"""Mistral 4 against transformers (fp32), torch runner: DeepSeek-V3's MLA and shared-expert MoE with a
softmax router, plus the per-token q temperature (pretraining length 8, so it changes every 8 tokens of
the prompts); and Mistral Small 4 as published, a Mistral3ForConditionalGeneration wrapping it.

The parity suite's paged-cache checks run here on this module's own `pair` fixture."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models
from transformers import AutoModelForCausalLM, Mistral4Config, Mistral4ForCausalLM

from localchat.arch.deepseek import RouterSpec
from localchat.arch.rope import attention_temperature
from localchat.backends import RunnerOptions
from localchat.backends.torch.runner import TorchRunner
from localchat.errors import ModelLoadError
from localchat.weights.config import ModelConfig
from localchat.weights.loader import load_model
from tests.backends.test_parity import (  # noqa: F401  (collected here, on this module's `pair`)
    test_batch_of_different_lengths,
    test_chunked_prefill,
    test_greedy_generation_matches_generate,
    test_mixed_prefill_and_decode,
    test_prefill_over_cached_prefix,
    test_prompt_and_greedy_decode_logits,
)
from tests.helpers.parity import PROMPT, assert_close, hf_logits
from tests.helpers.torch_batch import PagedDriver
from tests.helpers.torch_models import (
    MINISTRAL3_ROPE,
    TINY_DEEPSEEK,
    bundle_from_hf,
    fp32_runner,
    tiny_hf_model,
)

# transformers 5.24 does not list Mistral4ForCausalLM among the auto classes (tiny_hf_model uses them).
AutoModelForCausalLM.register(Mistral4Config, Mistral4ForCausalLM, exist_ok=True)
ROPE = {**MINISTRAL3_ROPE, "llama_4_scaling_beta": 0.5}
VARIANTS: dict[str, dict[str, Any]] = {
    # Low-rank q, rotary pairs (rope_interleave), layer 0 dense, layer 1 four experts + one shared.
    "mistral4": {**TINY_DEEPSEEK, "q_lora_rank": 24, "rope_parameters": ROPE, "routed_scaling_factor": 1.5},
    # One q_proj, rotary halves, values wider than keys, no renormalisation.
    "mistral4-halves": {
        **TINY_DEEPSEEK,
        "q_lora_rank": None,
        "rope_interleave": False,
        "v_head_dim": 32,
        "norm_topk_prob": False,
        "rope_parameters": ROPE,
    },
}


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request: pytest.FixtureRequest) -> tuple[torch.nn.Module, TorchRunner]:
    hf = tiny_hf_model("mistral4", **VARIANTS[request.param])
    return hf, fp32_runner(bundle_from_hf(hf))


def test_config_reads_router_and_temperature() -> None:
    config = ModelConfig.from_hf_dict(tiny_hf_model("mistral4", **VARIANTS["mistral4"]).config.to_dict())
    assert (config.num_key_value_heads, config.head_dim, config.rotary_dim) == (4, 24, 8)
    router = RouterSpec.from_config(config)
    assert (router.sigmoid, router.groups, router.renormalize, router.scale) == (False, 1, True, 1.5)
    assert attention_temperature(config) == (0.5, 8)
    with pytest.raises(ModelLoadError, match="groups"):
        ModelConfig.from_hf_dict(
            {**tiny_hf_model("mistral4").config.to_dict(), "n_group": 2, "topk_group": 1}
        )


def test_mistral_small_4_checkpoint_runs_its_text_model(tmp_path: Path) -> None:
    """Mistral3ForConditionalGeneration with a mistral4 text config: the text LM alone, the vision
    tower and projector skipped."""
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration

    text = tiny_hf_model("mistral4", **VARIANTS["mistral4"]).config.to_dict()
    vision = {"model_type": "pixtral", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1}
    vision |= {"num_attention_heads": 2, "head_dim": 16, "image_size": 32, "patch_size": 16}
    torch.manual_seed(0)
    hf = Mistral3ForConditionalGeneration(
        Mistral3Config(text_config=text, vision_config=vision, image_token_index=10)
    )
    with torch.no_grad():
        for name, param in hf.named_parameters():
            norm = name.endswith("norm.weight")
            param.copy_((1.0 if norm else 0.0) + (0.2 if norm else 0.15) * torch.randn_like(param))
    hf.eval().save_pretrained(tmp_path)
    vocab = {f"t{i}": i for i in range(256)}
    (tmp_path / "tokenizer.json").write_text(Tokenizer(models.WordLevel(vocab, unk_token="t0")).to_str())
    bundle = load_model(tmp_path)
    assert bundle.config.model_type == "mistral4"
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor([PROMPT * 2])).logits[0].float()
    driver = PagedDriver(fp32_runner(bundle))
    driver.add("a", PROMPT * 2)
    _, logits = driver.step_logits(every_token=True)
    assert_close(logits, ref)


@pytest.mark.mlx
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_mlx_matches_transformers(variant: str) -> None:
    """The MLX model file: prompt logits and greedy decode steps, the q temperature included."""
    pytest.importorskip("mlx.core")
    from localchat.backends.mlx.runner import MLXRunner

    hf = tiny_hf_model("mistral4", **VARIANTS[variant])
    runner = MLXRunner(bundle_from_hf(hf), RunnerOptions(device="cpu", dtype="float32", seed=0))
    driver = PagedDriver(runner)  # type: ignore[arg-type]
    driver.add("a", PROMPT * 2)
    _, logits = driver.step_logits(every_token=True)
    assert_close(torch.from_numpy(np.array(logits)).float(), hf_logits(hf, PROMPT * 2))
    for _ in range(4):
        driver.feed("a", int(np.array(logits[-1]).argmax()))
        _, logits = driver.step_logits()
        assert_close(torch.from_numpy(np.array(logits[0])).float(), hf_logits(hf, driver.tokens("a"))[-1])
