"""Llama 4 text model against transformers (fp32), torch runner: RoPE on (x0, x1) pairs with the L2 q/k
norm, NoPE layers with the position-dependent q temperature (floor_scale 4, so it changes within the
prompts), top-1 sigmoid routing that scales the expert's input plus a shared expert, interleaved dense
layers of their own width; the multimodal checkpoint's text LM; the context capped at one chunk.

The parity suite's paged-cache checks run here on this module's own `pair` fixture."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tokenizers import Tokenizer, models

from localchat.backends.torch.runner import TorchRunner
from localchat.weights.config import ModelConfig
from localchat.weights.loader import load_model
from tests.backends.test_torch_parity import (  # noqa: F401  (collected here, on this module's `pair`)
    PROMPT,
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
from tests.helpers.torch_models import LLAMA3_ROPE, bundle_from_hf, fp32_runner, tiny_hf_model

BASE: dict[str, Any] = {
    "num_hidden_layers": 4,
    "head_dim": 16,
    "num_local_experts": 4,
    "num_experts_per_tok": 1,
    "intermediate_size": 32,
    "intermediate_size_mlp": 96,
    "floor_scale": 4,
    "attn_scale": 0.5,
}
VARIANTS: dict[str, dict[str, Any]] = {
    # Scout's shape: every layer MoE, llama3 rope scaling, q/k norm on the rope layers.
    "llama4": {**BASE, "rope_parameters": LLAMA3_ROPE},
    # Maverick's: dense and MoE layers interleaved, top-2, no q/k norm.
    "llama4-interleaved": {
        **BASE,
        "interleave_moe_layer_step": 2,
        "num_experts_per_tok": 2,
        "use_qk_norm": False,
        "no_rope_layers": [1, 0, 1, 1],
    },
}


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request: pytest.FixtureRequest) -> tuple[torch.nn.Module, TorchRunner]:
    hf = tiny_hf_model("llama4_text", **VARIANTS[request.param])
    return hf, fp32_runner(bundle_from_hf(hf))


def test_layers_follow_the_config() -> None:
    hf = tiny_hf_model("llama4_text", **VARIANTS["llama4-interleaved"])
    runner = fp32_runner(bundle_from_hf(hf))
    layers = list(runner.model.layers)
    assert [layer.rope for layer in layers] == [True, False, True, True]
    assert [layer.moe is not None for layer in layers] == [False, True, False, True]
    assert tuple(layers[0].gate_up.shape) == (192, 64)  # intermediate_size_mlp


def test_context_is_capped_at_one_attention_chunk() -> None:
    d = tiny_hf_model("llama4_text", **BASE).config.to_dict()
    assert ModelConfig.from_hf_dict({**d, "attention_chunk_size": 64}).max_position_embeddings == 64
    assert ModelConfig.from_hf_dict({**d, "attention_chunk_size": None}).max_position_embeddings == 512


def test_multimodal_checkpoint_runs_its_text_model(tmp_path: Path) -> None:
    """Llama4ForConditionalGeneration's files: language_model.* renamed, vision model and projector
    skipped, the stacked experts transposed."""
    from transformers import Llama4Config, Llama4ForConditionalGeneration

    text = tiny_hf_model("llama4_text", **VARIANTS["llama4"]).config.to_dict()
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2}
    vision |= {"image_size": 32, "patch_size": 16, "vision_output_dim": 32, "projector_input_dim": 32}
    vision |= {"projector_output_dim": 64, "pixel_shuffle_ratio": 0.5}
    torch.manual_seed(0)
    hf = Llama4ForConditionalGeneration(Llama4Config(text_config=text, vision_config=vision))
    with torch.no_grad():
        for name, param in hf.named_parameters():
            norm = name.endswith("norm.weight")
            param.copy_((1.0 if norm else 0.0) + (0.2 if norm else 0.15) * torch.randn_like(param))
    hf.eval().save_pretrained(tmp_path)
    vocab = {f"t{i}": i for i in range(256)}
    (tmp_path / "tokenizer.json").write_text(Tokenizer(models.WordLevel(vocab, unk_token="t0")).to_str())
    bundle = load_model(tmp_path)
    assert bundle.config.model_type == "llama4_text"
    with torch.no_grad():  # its text LM directly: the wrapper's forward breaks without images (5.24)
        ref = hf.language_model(input_ids=torch.tensor([PROMPT * 2])).logits[0].float()
    driver = PagedDriver(fp32_runner(bundle))
    driver.add("a", PROMPT * 2)
    _, logits = driver.step_logits(every_token=True)
    assert_close(logits, ref)
