"""gpt-oss on the MLX runner (CPU device, float32) against transformers' GptOssForCausalLM, tiny random
weights (tests/backends/test_gpt_oss.py's model: a 4-token window on layer 0, sinks large enough to take
real probability mass, YaRN, biased router, clamped-SwiGLU experts stored stacked and interleaved), through
the MLX parity suite's checks at its 1e-4 bound: prompt + decode logits, ragged batch, cached prefix,
chunked prefill (7/6/9-token chunks), mixed steps, greedy decode with a preemption == generate. Every
prompt (3 to 33 tokens, most past 4) is longer than the window, so the window matters; so do the sinks.
The hub's MXFP4 experts, and those of a GGUF written by llama.cpp's converter from them, stay MXFP4 on MLX
(`mx.gather_qmm`, mode "mxfp4"), unpack bit for bit to the reference values and match transformers running
the same experts dequantized by its own converter."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
torch = pytest.importorskip("torch")

from localchat.backends.mlx.runner import MLXRunner  # noqa: E402
from localchat.weights.loader import load_model  # noqa: E402
from tests.backends.test_gpt_oss import _mxfp4_experts, tiny_gpt_oss  # noqa: E402
from tests.backends.test_parity import (  # noqa: E402, F401  (collected here, on this module's `pair`)
    test_batch_of_different_lengths,
    test_chunked_prefill,
    test_greedy_generation_matches_generate,
    test_logits_rows_follow_logits_indices,
    test_mixed_prefill_and_decode,
    test_prefill_over_cached_prefix,
    test_prompt_and_greedy_decode_logits,
)
from tests.helpers.parity import (  # noqa: E402
    PROMPT,
    Driver,
    assert_close,
    mlx_runner,
    tiny_tokenizer_json,
)
from tests.helpers.parity import hf_logits_np as hf_logits  # noqa: E402
from tests.helpers.torch_models import bundle_from_hf  # noqa: E402

pytestmark = pytest.mark.mlx


@pytest.fixture(scope="module")
def pair() -> tuple[Any, MLXRunner]:
    hf = tiny_gpt_oss()
    return hf, mlx_runner(bundle_from_hf(hf))


def test_windows_alternate(pair: tuple[Any, MLXRunner]) -> None:
    _, runner = pair
    assert [layer.window for layer in runner.model.layers] == [4, None]  # type: ignore[attr-defined]


@pytest.mark.parametrize("part", ["sinks", "window"])
def test_sinks_and_window_matter(part: str) -> None:
    """Without the sinks (or the window) the logits move: each is really applied on MLX."""
    hf = tiny_gpt_oss()
    runner = mlx_runner(bundle_from_hf(hf))
    for layer in runner.model.layers:
        if part == "sinks":
            layer.sinks = None  # type: ignore[attr-defined]
        else:
            layer.window = None  # type: ignore[attr-defined]
    driver = Driver(runner)  # type: ignore[arg-type]
    driver.add("a", PROMPT * 2)
    _, logits = driver.step_logits(every_token=True)
    assert np.abs(logits - hf_logits(hf, PROMPT * 2)).max() > 1e-3


def test_mxfp4_experts_stay_mxfp4_and_match_transformers(tmp_path: Path) -> None:
    """The hub's form (expert matrices as MXFP4 blocks + e8m0 scales): kept packed on MLX, logits equal
    transformers running the same experts dequantized by its own converter; the packed words and scales
    dequantize (MLX's mxfp4 mode) to exactly the arch module's float32 experts."""
    from safetensors.torch import save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    from localchat.backends.mlx.mxfp4 import Mxfp4Stack
    from localchat.weights.mxfp4 import dequantize_mxfp4

    hf: Any = tiny_gpt_oss()
    parts = _mxfp4_experts(hf)
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if f"{name}_blocks" in parts:
                param.copy_(
                    convert_moe_packed_tensors(
                        parts[f"{name}_blocks"], parts[f"{name}_scales"], dtype=torch.float32
                    )
                )
    state = {k: v for k, v in hf.state_dict().items() if f"{k}_blocks" not in parts} | parts
    save_file(
        {k: v.contiguous() for k, v in state.items()},
        str(tmp_path / "model.safetensors"),
        metadata={"format": "pt"},
    )
    config = hf.config.to_dict() | {"quantization_config": {"quant_method": "mxfp4"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "tokenizer.json").write_text(tiny_tokenizer_json())
    runner = mlx_runner(load_model(tmp_path))
    moe = runner.model.layers[0].moe  # type: ignore[attr-defined]
    down = moe.matrices["down"]
    assert isinstance(down, Mxfp4Stack) and isinstance(moe.matrices["gate_up"], Mxfp4Stack)
    assert down.packed.dtype == mx.uint32 and down.scales.dtype == mx.uint8
    blocks = parts["model.layers.0.mlp.experts.down_proj_blocks"].numpy()
    scales = parts["model.layers.0.mlp.experts.down_proj_scales"].numpy()
    unpacked = mx.dequantize(
        down.packed, down.scales, None, group_size=32, bits=4, mode="mxfp4", dtype=mx.float32
    )
    assert np.array_equal(np.array(unpacked), dequantize_mxfp4(blocks, scales))

    driver = Driver(runner)  # type: ignore[arg-type]
    prompt = PROMPT * 3  # 33 tokens: the sorted expert path (33 x 4 pairs) and the window
    driver.add("a", prompt)
    _, logits = driver.step_logits(every_token=True)
    assert_close(logits, hf_logits(hf, prompt))
    for _ in range(4):  # decode steps take the unsorted path
        driver.feed("a", int(logits[-1].argmax()))
        _, logits = driver.step_logits()
        assert_close(logits[0], hf_logits(hf, driver.tokens("a"))[-1])


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


@pytest.mark.slow  # runs llama.cpp's converter
def test_gguf_mxfp4_experts_stay_mxfp4_and_match_transformers(tmp_path: Path) -> None:
    """llama.cpp's gpt-oss file converted from the hub's MXFP4 experts (GGML MXFP4 blocks, gate and up
    apart): packed for MLX with the nibbles reshuffled, equal bit for bit to gguf's own dequantizer, and
    transformers' logits and greedy tokens."""
    from localchat.backends.mlx.mxfp4 import Mxfp4Stack
    from tests.backends.test_gpt_oss_gguf import PROMPT as GGUF_PROMPT
    from tests.backends.test_gpt_oss_gguf import mxfp4_model, tiny_model
    from tests.helpers.gpt_oss_gguf import convert_gpt_oss, save_folder
    from tests.helpers.parity import hf_generate

    hf = tiny_model(seed=3)
    path = convert_gpt_oss(save_folder(hf, tmp_path / "hf", mxfp4_model(hf)), tmp_path / "tiny-mxfp4.gguf")
    bundle = load_model(path)
    files = {w.name: w for w in bundle.iter_weights() if ".experts." in w.name}
    runner = mlx_runner(bundle)
    moe = runner.model.layers[1].moe  # type: ignore[attr-defined]
    assert all(isinstance(m, Mxfp4Stack) for m in moe.matrices.values())
    for name, parts in (("gate_up", ("gate", "up")), ("down", ("down",))):
        ref = np.concatenate(
            [files[f"model.layers.1.mlp.experts.{p}_proj.weight"].dequantize() for p in parts], axis=1
        )
        w = moe.matrices[name]
        ours = mx.dequantize(w.packed, w.scales, None, group_size=32, bits=4, mode="mxfp4", dtype=mx.float32)
        assert np.array_equal(np.array(ours), ref.reshape(ours.shape))

    prompt = GGUF_PROMPT * 2  # 24 tokens, past the 4-token window
    driver = Driver(runner)  # type: ignore[arg-type]
    driver.add("a", prompt)
    _, logits = driver.step_logits(every_token=True)
    assert_close(logits, hf_logits(hf, prompt))
    expected = hf_generate(hf, prompt, 8)
    for _ in expected:
        driver.feed("a", int(logits[-1].argmax()))
        _, logits = driver.step_logits()
    assert driver.tokens("a")[len(prompt) :] == expected
