"""Ministral 3 as it ships: a tiny GGUF the way llama.cpp writes it (arch `mistral3`, yarn metadata,
q temperature beta in `attention.temperature_scale`), and the text LM of a Mistral3ForConditionalGeneration
checkpoint whose text_config is ministral3. Both match transformers with the q temperature exercised
(pretraining length 8, prompts of 22 tokens), on the torch runner and the MLX one where mlx imports."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models
from transformers import Mistral3Config, Mistral3ForConditionalGeneration

from localchat.arch.rope import attention_temperature
from localchat.backends import RunnerOptions
from localchat.errors import ModelLoadError
from localchat.weights.bundle import ModelBundle
from localchat.weights.config import ModelConfig
from localchat.weights.loader import load_model
from tests.helpers.tiny_gguf import TINY_VOCAB_SIZE, write_tiny_gguf
from tests.helpers.torch_batch import PagedDriver
from tests.helpers.torch_models import MINISTRAL3_ROPE, VARIANTS, fp32_runner, tiny_hf_model

PROMPT = [5, 17, 99, 3, 250, 42, 7, 7, 81, 130, 64] * 2
TEXT = {
    "model_type": "ministral3",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 256,
    "max_position_embeddings": 512,
    "rope_parameters": {**MINISTRAL3_ROPE, "llama_4_scaling_beta": 0.5},
}
VISION = {
    "model_type": "pixtral",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "head_dim": 16,
    "image_size": 32,
    "patch_size": 16,
}


@pytest.mark.parametrize("variant", ["ministral3", "ministral3-hot-tied"])
def test_ministral3_gguf_matches_transformers_on_dequantized_weights(tmp_path: Path, variant: str) -> None:
    model_type, overrides = VARIANTS[variant]
    hf = tiny_hf_model(model_type, **{**overrides, "vocab_size": TINY_VOCAB_SIZE})
    bundle = load_model(write_tiny_gguf(tmp_path / "tiny.gguf", hf, qtype="Q8_0", tokenizer_kind="gpt2"))
    config = bundle.config
    rope = overrides["rope_parameters"]
    assert config.model_type == "ministral3"
    assert attention_temperature(config) == (pytest.approx(rope["llama_4_scaling_beta"]), 8)
    assert config.rope_scaling is not None and config.rope_scaling["rope_type"] == "yarn"
    # llama.cpp's yarn_log_multiplier is transformers' mscale_all_dim (mscale 1): attention factor 1.
    assert (config.rope_scaling["mscale"], config.rope_scaling["mscale_all_dim"]) == (1.0, 1.0)
    weights = list(bundle.iter_weights())
    assert any(w.dtype == "Q8_0" for w in weights)
    state = {w.name: torch.tensor(w.dequantize()) for w in weights}
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    with torch.no_grad():
        ref = hf(torch.tensor([PROMPT])).logits[0].float()
    for runner in _runners(bundle):
        assert (_prompt_logits(runner) - ref).abs().max().item() < 1e-4


def test_mistral3_checkpoint_with_a_ministral3_text_model_matches_transformers(tmp_path: Path) -> None:
    torch.manual_seed(0)
    hf = Mistral3ForConditionalGeneration(
        Mistral3Config(text_config=TEXT, vision_config=VISION, image_token_index=10)
    )
    with torch.no_grad():
        for name, param in hf.named_parameters():
            param.copy_(
                1.0 + 0.2 * torch.randn_like(param)
                if name.endswith("norm.weight")
                else 0.15 * torch.randn_like(param)
            )
    hf.eval().save_pretrained(tmp_path)
    vocab = {f"t{i}": i for i in range(256)}
    (tmp_path / "tokenizer.json").write_text(Tokenizer(models.WordLevel(vocab, unk_token="t0")).to_str())
    bundle = load_model(tmp_path)
    assert bundle.config.model_type == "ministral3"
    assert attention_temperature(bundle.config) == (0.5, 8)
    names = {w.name for w in bundle.iter_weights()}
    assert "model.layers.0.self_attn.q_proj.weight" in names and not any("vision" in n for n in names)
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor([PROMPT])).logits[0].float()
    for runner in _runners(bundle):
        assert (_prompt_logits(runner) - ref).abs().max().item() < 1e-4


def test_beta_without_an_original_length_is_a_load_error() -> None:
    hf_config = {**TEXT, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}
    config = ModelConfig.from_hf_dict({**hf_config, "llama_4_scaling_beta": 0.1})
    assert config.extra["llama_4_scaling_beta"] == 0.1
    with pytest.raises(ModelLoadError, match="original_max_position_embeddings"):
        attention_temperature(config)


def test_without_beta_the_layer_is_mistral() -> None:
    rope = {k: v for k, v in MINISTRAL3_ROPE.items() if k != "llama_4_scaling_beta"}
    assert attention_temperature(ModelConfig.from_hf_dict({**TEXT, "rope_parameters": rope})) is None


def _prompt_logits(runner: object) -> torch.Tensor:
    driver = PagedDriver(runner)  # type: ignore[arg-type]
    driver.add("a", PROMPT)
    _, logits = driver.step_logits(every_token=True)
    ours = logits if isinstance(logits, torch.Tensor) else torch.from_numpy(np.array(logits))
    return ours.float().cpu()


def _runners(bundle: ModelBundle) -> list[object]:
    """The torch runner, and the MLX one where mlx imports."""
    runners: list[object] = [fp32_runner(bundle)]
    try:
        from localchat.backends.mlx.runner import MLXRunner
    except ImportError:
        return runners
    return [*runners, MLXRunner(bundle, RunnerOptions(device="cpu", dtype="float32", seed=0))]
