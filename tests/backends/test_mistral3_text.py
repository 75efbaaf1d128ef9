"""Mistral Small 3.1-style checkpoints (Mistral3ForConditionalGeneration, as transformers saves them):
the text LM nested in `text_config` / `language_model.*` loads alone, the vision tower is skipped, and
its logits match the wrapper's on text-only input (yarn settings nested in `rope_parameters`)."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, models
from transformers import Mistral3Config, Mistral3ForConditionalGeneration

from localchat.weights.loader import load_model
from tests.helpers.torch_batch import PagedDriver
from tests.helpers.torch_models import fp32_runner

PROMPT = [5, 17, 99, 3, 250, 42, 7, 7, 81, 130, 64]
TEXT = {
    "model_type": "mistral",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 256,
    "max_position_embeddings": 512,
    "rope_parameters": {
        "rope_type": "yarn",
        "rope_theta": 1_000_000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 128,
    },
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


def test_text_model_of_a_mistral3_checkpoint_matches_transformers(tmp_path: Path) -> None:
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
    assert bundle.config.model_type == "mistral" and bundle.config.rope_scaling is not None
    assert bundle.config.rope_scaling["rope_type"] == "yarn"
    names = {w.name for w in bundle.iter_weights()}
    assert "model.layers.0.self_attn.q_proj.weight" in names and not any("vision" in n for n in names)
    driver = PagedDriver(fp32_runner(bundle))
    driver.add("a", PROMPT)
    _, logits = driver.step_logits(every_token=True)
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor([PROMPT])).logits[0].float()
    assert (logits.cpu() - ref).abs().max().item() < 1e-4
