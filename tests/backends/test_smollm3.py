"""SmolLM3 against transformers (fp32): NoPE layers (`no_rope_layers`), the sliding window on those
layers only, and llama.cpp's `smollm3` GGUF (q/k rows permuted, no NoPE list: every 4th layer).

The parity suite's paged-cache checks (prompt + decode, ragged batch, cached prefix, chunked prefill,
mixed steps, preemption) run here on this module's own `pair` fixture on the torch runner; the MLX model
file is checked on prompt and decode logits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from localchat.backends import RunnerOptions
from localchat.backends.torch.runner import TorchRunner
from localchat.weights.loader import load_model
from tests.backends.test_parity import (  # noqa: F401  (collected here, on this module's `pair`)
    test_batch_of_different_lengths,
    test_chunked_prefill,
    test_greedy_generation_matches_generate,
    test_mixed_prefill_and_decode,
    test_prefill_over_cached_prefix,
    test_prompt_and_greedy_decode_logits,
)
from tests.helpers.parity import GREEDY, PROMPT, assert_close, hf_generate, hf_logits
from tests.helpers.tiny_gguf import TINY_VOCAB_SIZE, write_tiny_gguf
from tests.helpers.torch_batch import PagedDriver
from tests.helpers.torch_models import bundle_from_hf, fp32_runner, tiny_hf_model

# Four layers: the 4th has no RoPE (transformers' default interval); the window (8, shorter than the
# prompts) slides only there, as SmolLM3's config builds `layer_types`.
VARIANTS = {
    "smollm3": {"num_hidden_layers": 4, "no_rope_layers": [1, 0, 1, 0]},
    "smollm3-sliding": {"num_hidden_layers": 4, "use_sliding_window": True, "sliding_window": 8},
}


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request: pytest.FixtureRequest) -> tuple[torch.nn.Module, TorchRunner]:
    hf = tiny_hf_model("smollm3", **VARIANTS[request.param])
    return hf, fp32_runner(bundle_from_hf(hf))


def test_config_reads_nope_layers_and_sliding_types() -> None:
    hf = tiny_hf_model("smollm3", **VARIANTS["smollm3-sliding"])
    runner = fp32_runner(bundle_from_hf(hf))
    layers = list(runner.model.layers)
    assert [layer.rope for layer in layers] == [True, True, True, False]
    windows = [None if layer.attn_options is None else layer.attn_options.window for layer in layers]
    assert windows == [None, None, None, 8]


def test_nope_layer_changes_the_output() -> None:
    """The same weights with RoPE on every layer give other logits: the NoPE flag is really used."""
    hf = tiny_hf_model("smollm3", **VARIANTS["smollm3"])
    runner = fp32_runner(bundle_from_hf(hf))
    for layer in runner.model.layers:
        layer.rope = True
    driver = PagedDriver(runner)
    driver.add("a", PROMPT)
    _, logits = driver.step_logits(every_token=True)
    assert (logits - hf_logits(hf, PROMPT)).abs().max().item() > 1e-2


def test_gguf_matches_transformers_on_dequantized_weights(tmp_path: Path) -> None:
    """llama.cpp's smollm3 file: tied embeddings, permuted q/k rows, NoPE on every 4th layer."""
    hf = tiny_hf_model("smollm3", num_hidden_layers=4, vocab_size=TINY_VOCAB_SIZE)
    path = write_tiny_gguf(tmp_path / "smollm3.gguf", hf, qtype="Q8_0", tokenizer_kind="gpt2")
    bundle = load_model(path)
    assert bundle.config.model_type == "smollm3" and bundle.config.tie_word_embeddings
    weights = list(bundle.iter_weights())
    assert any(w.dtype == "Q8_0" for w in weights)
    state = {w.name: torch.tensor(w.dequantize()) for w in weights}
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    runner = fp32_runner(bundle)
    assert [layer.rope for layer in runner.model.layers] == [True, True, True, False]
    prompt = PROMPT * 2
    driver = PagedDriver(runner)
    driver.add("a", prompt, GREEDY)
    _, logits = driver.step_logits(every_token=True)
    assert_close(logits, hf_logits(hf, prompt))
    driver.feed("a", int(logits[-1].argmax()))
    for _ in range(7):
        driver.step()
    assert driver.tokens("a")[len(prompt) :] == hf_generate(hf, prompt, 8)[:8]


def test_mlx_backend_names_the_families_it_lacks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every registered family has an MLX model file; one without (here: made to look so) is a typed
    error saying so, not an ImportError."""
    from localchat.arch.registry import ARCHITECTURES
    from localchat.backends.mlx import models
    from localchat.errors import UnsupportedArchitectureError

    assert all(models._built(a.family) for a in ARCHITECTURES.values())
    built = models._built
    monkeypatch.setattr(models, "_built", lambda family: family != "gemma4" and built(family))
    for model_type in ("gemma4_text", "gemma4"):
        with pytest.raises(
            UnsupportedArchitectureError, match=f"{model_type} on the MLX backend.*Supported: .*llama"
        ):
            models.model_class(model_type)
    assert models.model_class("llama").__module__.endswith("mlx.models.llama")


@pytest.mark.mlx
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_mlx_matches_transformers(variant: str) -> None:
    """The MLX model file: prompt logits (33 tokens, past the window) and greedy decode steps."""
    pytest.importorskip("mlx.core")
    from localchat.backends.mlx.runner import MLXRunner

    hf = tiny_hf_model("smollm3", **VARIANTS[variant])
    runner = MLXRunner(bundle_from_hf(hf), RunnerOptions(device="cpu", dtype="float32", seed=0))
    driver = PagedDriver(runner)  # type: ignore[arg-type]
    driver.add("a", PROMPT * 3)
    _, logits = driver.step_logits(every_token=True)
    assert_close(torch.from_numpy(np.array(logits)).float(), hf_logits(hf, PROMPT * 3))
    for _ in range(4):
        driver.feed("a", int(np.array(logits[-1]).argmax()))
        _, logits = driver.step_logits()
        assert_close(torch.from_numpy(np.array(logits[0])).float(), hf_logits(hf, driver.tokens("a"))[-1])
