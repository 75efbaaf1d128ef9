"""Gemma 4 (text) on the MLX runner (CPU device, float32) against transformers, tiny random weights: the
torch suite's variants (tests/backends/test_gemma4.py: sliding and global layers of different head
sizes, proportional RoPE, keys-as-values with KV sharing and the double-wide MLP, per-layer embeddings,
the MoE block) through the MLX parity suite's checks - prompt + decode logits, ragged batch, cached
prefix, chunked prefill, mixed steps, greedy decode with a preemption == generate - at its 1e-4 bound.
Prompts of 11 and 22 tokens are longer than the 8-token window, so the window matters."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
torch = pytest.importorskip("torch")

from localchat.backends.mlx.runner import MLXRunner  # noqa: E402
from localchat.weights.loader import load_model  # noqa: E402
from tests.backends.test_gemma4 import BASE, VARIANTS, tiny_gemma4  # noqa: E402
from tests.backends.test_parity import (  # noqa: E402, F401  (collected here, on this module's `pair`)
    test_batch_of_different_lengths,
    test_chunked_prefill,
    test_greedy_generation_matches_generate,
    test_logits_rows_follow_logits_indices,
    test_mixed_prefill_and_decode,
    test_prefill_over_cached_prefix,
    test_prompt_and_greedy_decode_logits,
)
from tests.helpers.parity import PROMPT, Driver, assert_close, mlx_runner  # noqa: E402
from tests.helpers.parity import hf_logits_np as hf_logits  # noqa: E402
from tests.helpers.torch_models import bundle_from_hf  # noqa: E402

pytestmark = pytest.mark.mlx


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request: pytest.FixtureRequest) -> tuple[Any, MLXRunner]:
    hf = tiny_gemma4(**VARIANTS[request.param])
    return hf, mlx_runner(bundle_from_hf(hf))


def test_cache_holds_the_widest_layer_once_per_kv_owner() -> None:
    runner = mlx_runner(bundle_from_hf(tiny_gemma4(**VARIANTS["gemma4-k-eq-v-shared"])))
    spec = runner.kv_cache_spec
    assert (spec.num_layers, spec.num_kv_heads, spec.head_dim) == (2, 2, 32)  # layers 2, 3 share 0, 1's
    layers = runner.model.layers
    assert [layer.source for layer in layers] == [0, 1, 0, 1]  # type: ignore[attr-defined]
    assert layers[1].v is None and layers[2].k is None  # type: ignore[attr-defined]


def test_proportional_rope_matters() -> None:
    """Rotating the global layers' whole head (plain RoPE) gives other logits: the table is really used."""
    from localchat.backends.mlx.models.gemma4 import TableRotary

    hf = tiny_gemma4(**BASE)
    runner = mlx_runner(bundle_from_hf(hf))
    plain = 1.0 / (1e6 ** (np.arange(0, 32, 2, dtype=np.float64) / 32))
    runner.model.rotaries["full_attention"] = TableRotary(plain.astype(np.float32))  # type: ignore[attr-defined]
    driver = Driver(runner)  # type: ignore[arg-type]
    driver.add("a", PROMPT)
    _, logits = driver.step_logits(every_token=True)
    assert np.abs(logits - hf_logits(hf, PROMPT)).max() > 1e-3


def test_window_matters() -> None:
    """Without the sliding window the logits past the window differ: the mask is really applied."""
    hf = tiny_gemma4(**BASE)
    runner = mlx_runner(bundle_from_hf(hf))
    for layer in runner.model.layers:
        layer.window = None  # type: ignore[attr-defined]
    driver = Driver(runner)  # type: ignore[arg-type]
    driver.add("a", PROMPT * 2)
    _, logits = driver.step_logits(every_token=True)
    ref = hf_logits(hf, PROMPT * 2)
    assert_close(logits[:8], ref[:8])  # inside the window nothing changes
    assert np.abs(logits[8:] - ref[8:]).max() > 1e-3


def test_small_chunks_take_the_decode_path_mid_prompt(pair: tuple[Any, MLXRunner]) -> None:
    """A 22-token prompt in chunks of 3, 1, 1, 2, 15: one-token chunks run as decode rows (the windowed
    decode mask), the rest as prefills over the cached blocks."""
    hf, runner = pair
    driver = Driver(runner, block_size=4)  # type: ignore[arg-type]
    prompt = PROMPT * 2
    driver.add("a", prompt)
    ref = hf_logits(hf, prompt)
    done = 0
    for chunk in (3, 1, 1, 2, 15):
        _, logits = driver.step_logits({"a": chunk}, every_token=True)
        assert_close(logits, ref[done : done + chunk])
        done += chunk


def test_multimodal_checkpoint_runs_its_text_model(tmp_path: Path) -> None:
    """Gemma4ForConditionalGeneration's files on MLX: the text LM under model.language_model, towers
    skipped, per-layer embeddings (a token table of their own) loaded from the folder."""
    from tokenizers import Tokenizer, models
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration

    text = tiny_gemma4(**VARIANTS["gemma4-per-layer-embeddings"]).config.to_dict()
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2}
    vision |= {"num_key_value_heads": 2, "head_dim": 16}
    torch.manual_seed(0)
    hf = Gemma4ForConditionalGeneration(
        Gemma4Config(text_config=text, vision_config=vision, audio_config=None)
    )
    with torch.no_grad():
        for name, param in hf.named_parameters():
            base, scale = (1.0, 0.2) if name.endswith("norm.weight") else (0.0, 0.15)
            param.copy_(base + scale * torch.randn_like(param))
    hf.eval().save_pretrained(tmp_path)
    vocab = {f"t{i}": i for i in range(256)}
    (tmp_path / "tokenizer.json").write_text(Tokenizer(models.WordLevel(vocab, unk_token="t0")).to_str())
    bundle = load_model(tmp_path)
    assert bundle.config.model_type == "gemma4_text"
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor([PROMPT * 2])).logits[0].float().numpy()
    driver = Driver(mlx_runner(bundle))  # type: ignore[arg-type]
    driver.add("a", PROMPT * 2)
    _, logits = driver.step_logits(every_token=True)
    assert_close(logits, ref)
