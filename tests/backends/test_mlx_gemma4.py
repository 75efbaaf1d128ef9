"""Gemma 4 (text) on the MLX runner (CPU device, float32) against transformers, tiny random weights: the
torch suite's variants (tests/backends/test_gemma4.py: sliding and global layers of different head
sizes, proportional RoPE, keys-as-values with KV sharing and the double-wide MLP, per-layer embeddings,
the MoE block) through the MLX parity suite's checks - prompt + decode logits, ragged batch, cached
prefix, chunked prefill, mixed steps, greedy decode with a preemption == generate - at its 1e-4 bound.
Prompts of 11 and 22 tokens are longer than the 8-token window, so the window matters."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
torch = pytest.importorskip("torch")

from localchat.backends.mlx.runner import MLXRunner  # noqa: E402
from tests.backends.test_gemma4 import BASE, VARIANTS, tiny_gemma4  # noqa: E402
from tests.backends.test_mlx_parity import (  # noqa: E402, F401  (collected here, on this module's `pair`)
    PROMPT,
    Driver,
    assert_close,
    hf_logits,
    mlx_runner,
    test_batch_of_different_lengths,
    test_chunked_prefill,
    test_greedy_generation_matches_generate,
    test_logits_rows_follow_logits_indices,
    test_mixed_prefill_and_decode,
    test_prefill_over_cached_prefix,
    test_prompt_and_greedy_decode_logits,
)
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
