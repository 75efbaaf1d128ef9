"""Every backend's runner against transformers on tiny random models, fp32 on the CPU (MLX on its CPU
device), through every shape of step the engine produces: logits within 1e-4 (tests/helpers/parity.py
says why that bound) and greedy tokens identical. The shared tests run each backend on every model
variant (`tests/helpers/torch_models.py: VARIANTS`); the per-backend tests after them cover what only
one backend has (GGUF blocks kept quantized on MLX, bf16 on torch, ...). Family modules (test_gemma4.py,
test_mlx_gemma4.py, ...) import the shared tests and run them on their own `pair`."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from localchat.backends import RunnerOptions
from localchat.backends.torch.runner import TorchRunner
from localchat.engine.sampling_params import SamplingParams
from localchat.errors import UnsupportedArchitectureError
from localchat.weights.config import ModelConfig
from localchat.weights.loader import load_model
from tests.helpers.parity import (
    GREEDY,
    PROMPT,
    Driver,
    assert_close,
    hf_generate,
    hf_logits,
    hf_logits_np,
    mlx_runner,
    tiny_tokenizer_json,
)
from tests.helpers.torch_models import VARIANTS, bundle_from_hf, fp32_runner, tiny_hf_model

HAS_MLX = importlib.util.find_spec("mlx") is not None
if HAS_MLX:
    import mlx.core as mx

    from localchat.backends.mlx.quant import REQUANTIZED, QuantizedWeight, take_rows, to_weight
    from localchat.backends.mlx.runner import MLXRunner

MLX_ONLY = pytest.mark.skipif(not HAS_MLX, reason="needs mlx (pip install 'mlx[cpu]')")
MLX_MARKS = [pytest.mark.mlx, MLX_ONLY]
BACKENDS = ["torch", pytest.param("mlx", marks=MLX_MARKS)]

Pair = tuple[torch.nn.Module, Any]  # (transformers model, a backend's runner on its weights)


def runner_for(backend: str, bundle: Any) -> Any:
    return fp32_runner(bundle) if backend == "torch" else mlx_runner(bundle)


PAIRS = [
    *(pytest.param(("torch", v), id=f"torch-{v}") for v in VARIANTS),
    *(pytest.param(("mlx", v), id=f"mlx-{v}", marks=MLX_MARKS) for v in VARIANTS),
]


@pytest.fixture(scope="module", params=PAIRS)
def pair(request: pytest.FixtureRequest) -> Pair:
    backend, variant = request.param
    model_type, overrides = VARIANTS[variant]
    hf = tiny_hf_model(model_type, **overrides)
    return hf, runner_for(backend, bundle_from_hf(hf))


def test_prompt_and_greedy_decode_logits(pair: Pair) -> None:
    hf, runner = pair
    driver = Driver(runner)
    driver.add("a", PROMPT)
    _, logits = driver.step_logits(every_token=True)
    assert_close(logits, hf_logits(hf, PROMPT))
    for _ in range(8):
        driver.feed("a", int(logits[-1].argmax()))
        _, logits = driver.step_logits()
        assert_close(logits[0], hf_logits(hf, driver.tokens("a"))[-1])


def test_batch_of_different_lengths(pair: Pair) -> None:
    hf, runner = pair
    driver = Driver(runner)
    prompts = {"a": PROMPT[:3], "b": PROMPT * 3, "c": PROMPT[::-1]}
    for req_id, prompt in prompts.items():
        driver.add(req_id, prompt)
    for _ in range(3):  # one prefill step for all, then decode steps for all
        ids, logits = driver.step_logits()
        for row, req_id in enumerate(ids):
            assert_close(logits[row], hf_logits(hf, driver.tokens(req_id))[-1])
            driver.feed(req_id, int(logits[row].argmax()))


def test_prefill_over_cached_prefix(pair: Pair) -> None:
    hf, runner = pair
    driver = Driver(runner, block_size=4)
    first = [*PROMPT, 11, 12, 13, 14, 15]  # 16 tokens: four full blocks
    driver.add("a", first)
    driver.step()
    # b reuses a's first 12 tokens from the cache (3 blocks) and computes only its own suffix.
    second = [*first[:12], 200, 201, 202]
    driver.add("b", second, share_prefix_with="a", num_cached=12)
    _, logits = driver.step_logits({"b": 3}, every_token=True)
    assert_close(logits, hf_logits(hf, second)[12:])


def test_chunked_prefill(pair: Pair) -> None:
    hf, runner = pair
    driver = Driver(runner, block_size=4)
    prompt = PROMPT * 2  # 22 tokens in chunks of 7, 6 (a middle chunk, not block aligned), 9
    driver.add("a", prompt)
    ref = hf_logits(hf, prompt)
    done = 0
    for chunk in (7, 6, 9):
        _, logits = driver.step_logits({"a": chunk}, every_token=True)
        assert_close(logits, ref[done : done + chunk])
        done += chunk


@pytest.mark.parametrize("decode_first", [True, False], ids=["decode-first", "chunk-first"])
def test_mixed_prefill_and_decode(pair: Pair, decode_first: bool) -> None:
    hf, runner = pair
    driver = Driver(runner, block_size=4)
    driver.add("dec", PROMPT)
    driver.add("chunked", PROMPT * 2)
    driver.step({"dec": len(PROMPT), "chunked": 5})
    driver.add("new", PROMPT[2:9])
    # A decode row, a middle prefill chunk and a fresh prefill in one step, the decode row first or
    # after the chunk: outputs come back in order.
    schedule = {"dec": 1, "chunked": 8, "new": 7} if decode_first else {"chunked": 8, "dec": 1, "new": 7}
    ids, logits = driver.step_logits(schedule, every_token=True)
    ref = {
        "dec": hf_logits(hf, driver.tokens("dec"))[-1:],
        "chunked": hf_logits(hf, PROMPT * 2)[5:13],
        "new": hf_logits(hf, PROMPT[2:9]),
    }
    for req_id, expected in ref.items():
        rows = [i for i, r in enumerate(ids) if r == req_id]
        assert_close(logits[rows], expected)


def test_greedy_generation_matches_generate(pair: Pair) -> None:
    """Three requests arriving at different steps, decoded together, preempted and resumed."""
    hf, runner = pair
    prompts = {"a": PROMPT, "b": PROMPT[4:], "c": [9, 8, 7, 6, 5, 4, 3, 2]}
    n = 12
    expected = {r: hf_generate(hf, p, n) for r, p in prompts.items()}
    driver = Driver(runner)
    driver.add("a", prompts["a"], GREEDY)
    driver.step()
    driver.add("b", prompts["b"], GREEDY)
    for step in range(n + 3):
        if step == 2:
            driver.add("c", prompts["c"], GREEDY)
        if step == 5:
            driver.preempt("b")  # comes back with its output tokens as part of the recomputed prefix
        todo = {r: len(q.tokens) - q.num_computed for r, q in driver.reqs.items()}
        todo = {r: k for r, k in todo.items() if len(driver.tokens(r)) - len(prompts[r]) < n}
        if not todo:
            break
        driver.step(todo)
    for req_id, prompt in prompts.items():
        got = driver.tokens(req_id)[len(prompt) :]
        assert got[: len(expected[req_id])] == expected[req_id]


def test_logits_rows_follow_logits_indices(pair: Pair) -> None:
    """A middle chunk samples nothing; only finished rows get logits, in `sample_req_ids` order."""
    hf, runner = pair
    driver = Driver(runner)
    driver.add("long", PROMPT * 2)
    driver.add("short", PROMPT[:5])
    ids, logits = driver.step_logits({"long": 10, "short": 5})
    assert ids == ["short"] and logits.shape[0] == 1
    assert_close(logits[0], hf_logits(hf, PROMPT[:5])[-1])
    # A step with only a middle chunk still writes its K/V: the next chunk attends over it.
    ids, logits = driver.step_logits({"long": 6})
    assert ids == [] and logits.shape[0] == 0
    _, logits = driver.step_logits({"long": 6}, every_token=True)
    assert_close(logits, hf_logits(hf, PROMPT * 2)[16:22])


@pytest.mark.parametrize("backend", BACKENDS)
def test_unknown_architecture_lists_supported(backend: str) -> None:
    hf = tiny_hf_model("llama")
    bundle = bundle_from_hf(hf)
    bundle.config = ModelConfig.from_hf_dict({**hf.config.to_dict(), "model_type": "gpt_neox"})
    with pytest.raises(
        UnsupportedArchitectureError,
        match=r"gpt_neox.*Supported: .*llama.*mistral3.*mixtral.*phi3.*qwen3_moe",
    ):
        runner_for(backend, bundle)


# Torch only.


def test_torch_safetensors_folder_with_nested_rope_parameters(tmp_path: Path) -> None:
    """transformers 5 writes rope_theta only inside `rope_parameters`; a wrong base diverges at once."""
    hf = tiny_hf_model("qwen2", rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0})
    hf.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert "rope_theta" not in saved and saved["rope_parameters"]["rope_theta"] == 1_000_000.0
    (tmp_path / "tokenizer.json").write_text(tiny_tokenizer_json())
    runner = fp32_runner(load_model(tmp_path))
    driver = Driver(runner)
    driver.add("a", PROMPT * 2)
    _, logits = driver.step_logits(every_token=True)
    assert_close(logits, hf_logits(hf, PROMPT * 2))


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0"])
def test_torch_gguf_matches_transformers_on_dequantized_weights(tmp_path: Path, qtype: str) -> None:
    from tests.helpers.tiny_gguf import TINY_VOCAB_SIZE, write_tiny_gguf

    # Row length 64 is a multiple of the 32-wide Q8_0/Q4_0 blocks, so the linears are really quantized.
    hf = tiny_hf_model("llama", vocab_size=TINY_VOCAB_SIZE)
    path = write_tiny_gguf(tmp_path / "tiny.gguf", hf, qtype=qtype, tokenizer_kind="gpt2")
    bundle = load_model(path)
    weights = list(bundle.iter_weights())
    assert any(w.dtype == qtype for w in weights)
    # The reference: transformers on exactly the weights we run (dequantized, q/k un-permuted).
    state = {w.name: torch.tensor(w.dequantize()) for w in weights}
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    runner = fp32_runner(bundle)
    prompt = PROMPT * 2
    driver = Driver(runner)
    driver.add("a", prompt, GREEDY)
    _, logits = driver.step_logits(every_token=True)
    assert_close(logits, hf_logits(hf, prompt))
    driver.feed("a", int(logits[-1].argmax()))
    for _ in range(7):
        driver.step()
    assert driver.tokens("a")[len(prompt) :] == hf_generate(hf, prompt, 8)[:8]


GEMMA_GGUF = {
    "gemma2": {"attn_logit_softcapping": 2.0, "final_logit_softcapping": 5.0},
    # llama.cpp hard-codes Gemma 3's period of 6 (five sliding layers, then a global one).
    "gemma3_text": {
        "num_hidden_layers": 6,
        "layer_types": None,
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        },
    },
}


@pytest.mark.parametrize("model_type", list(GEMMA_GGUF))
def test_torch_gemma_gguf_matches_transformers(tmp_path: Path, model_type: str) -> None:
    """llama.cpp's gemma2/gemma3 layout: four norms per layer renamed, stored as 1 + weight; the
    window, soft-caps and local RoPE base come from the metadata (GGUF has no query_pre_attn_scalar:
    head_dim, as llama.cpp assumes)."""
    from tests.helpers.tiny_gguf import TINY_VOCAB_SIZE, write_tiny_gguf

    hf = tiny_hf_model(
        model_type,
        vocab_size=TINY_VOCAB_SIZE,
        head_dim=16,
        sliding_window=8,
        query_pre_attn_scalar=16,
        **GEMMA_GGUF[model_type],
    )
    path = write_tiny_gguf(tmp_path / "tiny.gguf", hf, qtype="Q8_0", tokenizer_kind="gpt2")
    bundle = load_model(path)
    assert bundle.config.model_type == model_type and bundle.config.sliding_window == 8
    weights = list(bundle.iter_weights())
    state = {w.name: torch.tensor(w.dequantize()) for w in weights}
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    prompt = PROMPT * 2
    driver = Driver(fp32_runner(bundle))
    driver.add("a", prompt, GREEDY)
    _, logits = driver.step_logits(every_token=True)
    assert_close(logits, hf_logits(hf, prompt))
    driver.feed("a", int(logits[-1].argmax()))
    for _ in range(7):
        driver.step()
    assert driver.tokens("a")[len(prompt) :] == hf_generate(hf, prompt, 8)[:8]


def test_torch_bfloat16_runner_tracks_fp32_reference() -> None:
    """The CPU default dtype path (bf16, one-token steps through the native GEMV): close, not exact."""
    hf = tiny_hf_model("llama")
    runner = TorchRunner(bundle_from_hf(hf), RunnerOptions(device="cpu", dtype="bfloat16"))
    driver = Driver(runner)
    driver.add("a", PROMPT)
    for _ in range(4):
        _, logits = driver.step_logits()
        ref = hf_logits_np(hf, driver.tokens("a"))[-1]
        assert float(logits[0] @ ref / np.linalg.norm(logits[0]) / np.linalg.norm(ref)) > 0.999
        driver.feed("a", int(ref.argmax()))


# MLX only.


@MLX_ONLY
@pytest.mark.mlx
@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1"])
def test_mlx_gguf_stays_quantized_and_matches_dequantized_reference(tmp_path: Path, qtype: str) -> None:
    from tests.helpers.tiny_gguf import TINY_VOCAB_SIZE, write_tiny_gguf

    # Row length 64 is a multiple of the 32-wide blocks, so every linear is really quantized.
    hf = tiny_hf_model("llama", vocab_size=TINY_VOCAB_SIZE)
    path = write_tiny_gguf(tmp_path / "tiny.gguf", hf, qtype=qtype, tokenizer_kind="gpt2")
    bundle = load_model(path)
    weights = list(bundle.iter_weights())
    # The reference: transformers on exactly the weights we run (dequantized, q/k un-permuted).
    state = {w.name: torch.from_numpy(np.array(w.dequantize())) for w in weights}
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    runner = mlx_runner(bundle)
    layer = runner.model.layers[0]
    bits = 8 if qtype == "Q8_0" else 4
    for weight in (layer.qkv, layer.o, layer.gate_up, layer.down, runner.model.embed):
        assert isinstance(weight, QuantizedWeight) and weight.bits == bits
    prompt = PROMPT * 2
    driver = Driver(runner)
    driver.add("a", prompt, GREEDY)
    _, logits = driver.step_logits(every_token=True)
    assert_close(logits, hf_logits(hf, prompt))
    driver.feed("a", int(logits[-1].argmax()))
    for _ in range(7):
        driver.step()
    assert driver.tokens("a")[len(prompt) :] == hf_generate(hf, prompt, 8)[:8]


@MLX_ONLY
@pytest.mark.mlx
@pytest.mark.parametrize("qtype", ["Q5_0", "Q4_K", "Q5_K", "Q6_K", "Q3_K", "Q2_K"])
def test_mlx_more_gguf_types_stay_quantized(tmp_path: Path, qtype: str) -> None:
    """Q5_0 / Q4_K / Q5_K map exactly onto MLX groups: parity with transformers on the dequantized
    weights. Q6_K, Q3_K and Q2_K are re-quantized (test_mlx_quant.py bounds each value): parity with
    transformers on the values MLX keeps, which proves the model runs on them as stored. (Against the
    file's own values a random two-layer model amplifies Q3_K's 4-bit re-quantization noise, 7.8% RMS,
    to a logit cosine of 0.81, and 8-bit Q6_K's 0.46% to 0.9988.)"""
    from tests.helpers.tiny_gguf import TINY_VOCAB_SIZE, write_tiny_gguf

    # K-quants need 256-wide rows; the 64-wide linears fall back to F32 in the file, so use hidden 256.
    hf = tiny_hf_model("llama", vocab_size=TINY_VOCAB_SIZE, hidden_size=256, intermediate_size=256)
    path = write_tiny_gguf(tmp_path / "tiny.gguf", hf, qtype=qtype, tokenizer_kind="gpt2")
    bundle = load_model(path)
    weights = list(bundle.iter_weights())
    assert any(w.dtype == qtype for w in weights)
    reference = {w.name: np.array(w.dequantize()) for w in weights}
    for w in weights:
        if w.dtype in REQUANTIZED:
            kept = to_weight(w, mx.float32)
            reference[w.name] = np.array(take_rows(kept, mx.arange(w.shape[0]))).reshape(w.shape)
    hf.load_state_dict({name: torch.from_numpy(values) for name, values in reference.items()}, strict=False)
    runner = mlx_runner(bundle)
    qkv = runner.model.layers[0].qkv
    assert (
        isinstance(qkv, QuantizedWeight)
        and qkv.bits == ({"Q5_0": 5, "Q4_K": 4, "Q5_K": 5} | REQUANTIZED)[qtype]
    )
    driver = Driver(runner)
    driver.add("a", PROMPT)
    _, logits = driver.step_logits(every_token=True)
    assert_close(logits, hf_logits(hf, PROMPT))


@MLX_ONLY
@pytest.mark.mlx
def test_mlx_half_precision_on_cpu_tracks_fp32_reference() -> None:
    """bfloat16 compute (the Metal-style path, forced on CPU): close, not exact."""
    hf = tiny_hf_model("llama")
    runner = mlx_runner(bundle_from_hf(hf), dtype="bfloat16")
    assert runner.kv_cache_spec.dtype_bytes == 2
    driver = Driver(runner)
    driver.add("a", PROMPT)
    for _ in range(4):
        _, logits = driver.step_logits()
        ref = hf_logits_np(hf, driver.tokens("a"))[-1]
        cosine = float(logits[0] @ ref / np.linalg.norm(logits[0]) / np.linalg.norm(ref))
        assert cosine > 0.999
        driver.feed("a", int(ref.argmax()))


@MLX_ONLY
@pytest.mark.mlx
def test_mlx_registry_builds_the_runner() -> None:
    from localchat.backends import create_runner

    runner = create_runner("mlx", bundle_from_hf(tiny_hf_model("qwen2")), RunnerOptions(device="cpu"))
    assert isinstance(runner, MLXRunner)
    assert runner.device_name == "mlx cpu (float32)"
    assert runner.kv_cache_spec.dtype_bytes == 4


@MLX_ONLY
@pytest.mark.mlx
def test_mlx_parts_in_different_formats_stay_separate_matmuls() -> None:
    """q in Q4_0, k in Q8_0, v dense: q|k|v cannot share one matrix, yet the layer computes the same."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    from localchat.weights.tensors import WeightTensor

    hf = tiny_hf_model("llama")
    formats = {"q_proj": "Q4_0", "k_proj": "Q8_0", "gate_proj": "Q4_1", "up_proj": "Q4_1"}
    tensors = []
    for name, tensor in hf.state_dict().items():
        qtype = next((q for part, q in formats.items() if f".{part}." in name), None)
        values = tensor.numpy()
        if qtype is None:
            tensors.append(WeightTensor(name, tuple(values.shape), "F32", values))
        else:
            blocks = quantize(values, GGMLQuantizationType[qtype])
            tensors.append(WeightTensor(name, tuple(values.shape), qtype, blocks))
    hf.load_state_dict({w.name: torch.from_numpy(np.array(w.dequantize())) for w in tensors})
    bundle = bundle_from_hf(hf)
    bundle.iter_weights = lambda: iter(tensors)
    runner = mlx_runner(bundle)
    layer = runner.model.layers[0]
    assert isinstance(layer.qkv, list) and len(layer.qkv) == 3  # three formats: three matmuls
    assert isinstance(layer.gate_up, QuantizedWeight) and layer.gate_up.bits == 4  # one format: fused
    driver = Driver(runner)
    driver.add("a", PROMPT)
    _, logits = driver.step_logits(every_token=True)
    assert_close(logits, hf_logits(hf, PROMPT))


@MLX_ONLY
@pytest.mark.mlx
def test_mlx_missing_or_misshapen_weights_are_named() -> None:
    from localchat.errors import ModelLoadError

    bundle = bundle_from_hf(tiny_hf_model("qwen2"))
    weights = list(bundle.iter_weights())
    bundle.iter_weights = lambda: (w for w in weights if w.name != "model.layers.1.self_attn.k_proj.bias")
    with pytest.raises(ModelLoadError, match=r"model\.layers\.1\.qkv_bias"):
        mlx_runner(bundle)
    bundle.iter_weights = lambda: (w for w in weights if w.name != "model.layers.1.mlp.down_proj.weight")
    with pytest.raises(ModelLoadError, match=r"model\.layers\.1\.down"):
        mlx_runner(bundle)
    bad = [w for w in weights if w.name != "model.norm.weight"]
    bad.append(type(weights[0])("model.norm.weight", (3,), "F32", np.ones(3, dtype=np.float32)))
    bundle.iter_weights = lambda: iter(bad)
    with pytest.raises(ModelLoadError, match=r"model\.norm\.weight.*\(3,\)"):
        mlx_runner(bundle)


@MLX_ONLY
@pytest.mark.mlx
def test_mlx_steps_run_on_the_engine_thread() -> None:
    """Built on this thread, stepped on another (as AsyncEngine does): on Metal, streams are per thread."""
    import threading

    hf = tiny_hf_model("llama")
    runner = mlx_runner(bundle_from_hf(hf))
    result: dict[str, object] = {}

    def work() -> None:
        try:
            driver = Driver(runner)
            driver.add("a", PROMPT, SamplingParams(temperature=0.7, seed=5))
            for _ in range(3):
                driver.step()
            result["tokens"] = driver.tokens("a")[len(PROMPT) :]
        except Exception as exc:  # surfaced below
            result["error"] = exc

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert "error" not in result, result.get("error")
    assert len(result["tokens"]) == 3  # type: ignore[arg-type]
