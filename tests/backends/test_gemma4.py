"""Gemma 4 (dense text model) against transformers (fp32), torch runner: sliding and global layers of
different head sizes, proportional RoPE on the global ones, q/k/v norms, unscaled scores, layer scalars,
final soft-capping; keys-as-values with fewer global KV heads, KV sharing and the double-wide MLP;
per-layer embeddings (E2B / E4B); the MoE block (26B-A4B); the multimodal checkpoint's text LM.

The parity suite's paged-cache checks (prompt + decode, ragged batch, cached prefix, chunked prefill,
mixed steps, preemption) run here on this module's own `pair` fixture."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tokenizers import Tokenizer, models

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
from tests.helpers.torch_models import bundle_from_hf, fp32_runner, tiny_hf_model

# Sliding layers: 16-wide heads, 2 KV heads, window 8 (shorter than the prompts); global layers: 32-wide
# heads, RoPE on a quarter of them (transformers' default proportional table), soft-capped logits.
BASE: dict[str, Any] = {
    "num_hidden_layers": 4,
    "head_dim": 16,
    "global_head_dim": 32,
    "sliding_window": 8,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    "final_logit_softcapping": 5.0,
    "hidden_size_per_layer_input": 0,
}
VARIANTS: dict[str, dict[str, Any]] = {
    "gemma4": BASE,
    # Global layers without v_proj (values = keys) and one KV head; the last two layers reuse layers
    # 0 and 1's keys and values and have a twice-wide MLP.
    "gemma4-k-eq-v-shared": {
        **BASE,
        "attention_k_eq_v": True,
        "num_global_key_value_heads": 1,
        "num_kv_shared_layers": 2,
        "use_double_wide_mlp": True,
    },
    # E2B / E4B's shape: per-layer embeddings (8 wide per layer) and KV sharing.
    "gemma4-per-layer-embeddings": {
        **BASE,
        "hidden_size_per_layer_input": 8,
        "vocab_size_per_layer_input": 256,
        "num_kv_shared_layers": 2,
    },
    # 26B-A4B's shape: an MoE block (4 experts, top 2) beside every dense MLP.
    "gemma4-moe": {
        **BASE,
        "enable_moe_block": True,
        "num_experts": 4,
        "top_k_experts": 2,
        "moe_intermediate_size": 32,
    },
}


def tiny_gemma4(**overrides: Any) -> torch.nn.Module:
    hf = tiny_hf_model("gemma4_text", **overrides)
    # transformers 5.24 skips the KV-sharing layers for positions whose logits are not kept and then
    # indexes the per-layer inputs, which models without them lack; asking for hidden states turns that off.
    hf.config.output_hidden_states = bool(overrides.get("num_kv_shared_layers"))
    with torch.no_grad():  # layer_scalar is a buffer (tiny_hf_model randomises parameters only)
        for name, buffer in hf.named_buffers():
            if name.endswith("layer_scalar"):
                buffer.copy_(0.5 + torch.rand_like(buffer))
    return hf


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request: pytest.FixtureRequest) -> tuple[torch.nn.Module, TorchRunner]:
    hf = tiny_gemma4(**VARIANTS[request.param])
    return hf, fp32_runner(bundle_from_hf(hf))


def test_sizes_and_cache_layout() -> None:
    hf = tiny_gemma4(**VARIANTS["gemma4-k-eq-v-shared"])
    runner = fp32_runner(bundle_from_hf(hf))
    x = runner.config.extra
    assert x["layer_head_dims"] == [16, 32, 16, 32] and x["layer_kv_heads"] == [2, 1, 2, 1]
    assert (runner.config.head_dim, runner.config.num_key_value_heads) == (32, 2)
    layers = list(runner.model.layers)
    assert [layer.source for layer in layers] == [0, 1, 0, 1]
    assert layers[1].v is None and layers[2].k is None and layers[3].k is None
    assert runner.kv_cache_spec.num_layers == 2  # the sharing layers keep no cache of their own


def test_multimodal_checkpoint_runs_its_text_model(tmp_path: Path) -> None:
    """Gemma4ForConditionalGeneration's files: the text LM under model.language_model, towers skipped."""
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration

    text = tiny_gemma4(**BASE).config.to_dict()
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2}
    vision |= {"num_key_value_heads": 2, "head_dim": 16}
    torch.manual_seed(0)
    hf = Gemma4ForConditionalGeneration(
        Gemma4Config(text_config=text, vision_config=vision, audio_config=None)
    )
    with torch.no_grad():
        for name, param in hf.named_parameters():
            scale = 0.2 if name.endswith("norm.weight") else 0.15
            param.copy_((1.0 if name.endswith("norm.weight") else 0.0) + scale * torch.randn_like(param))
    hf.eval().save_pretrained(tmp_path)
    vocab = {f"t{i}": i for i in range(256)}
    (tmp_path / "tokenizer.json").write_text(Tokenizer(models.WordLevel(vocab, unk_token="t0")).to_str())
    bundle = load_model(tmp_path)
    assert bundle.config.model_type == "gemma4_text"
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor([PROMPT * 2])).logits[0].float()
    driver = PagedDriver(fp32_runner(bundle))
    driver.add("a", PROMPT * 2)
    _, logits = driver.step_logits(every_token=True)
    assert_close(logits, ref)


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [("use_bidirectional_attention", "all", "bidirectional")],
)
def test_unbuilt_variants_fail_by_name(key: str, value: object, words: str) -> None:
    d = {**tiny_gemma4(**BASE).config.to_dict(), key: value}
    with pytest.raises(ModelLoadError, match=words):
        ModelConfig.from_hf_dict(d)


def test_proportional_rope_matters() -> None:
    """Rotating the global layers' whole head (plain RoPE) gives other logits: the table is really used."""
    hf = tiny_gemma4(**BASE)
    runner = fp32_runner(bundle_from_hf(hf))
    model = runner.model
    model.inv_freqs["full_attention"] = 1.0 / (1e6 ** (torch.arange(0, 32, 2).float() / 32))
    driver = PagedDriver(runner)
    driver.add("a", PROMPT)
    _, logits = driver.step_logits(every_token=True)
    assert (logits - hf_logits(hf, PROMPT)).abs().max().item() > 1e-3
