"""`--isq q8_0 | q4_k | q4_0`: dense weights quantized at load into GGUF blocks that our CPU kernels run.

The quantizer's bytes are read identically by the `gguf` package's reference dequantizer and by our
kernels (so they are the formats' true bytes), each value lies within half a quantization step, and
a whole tiny model quantized at load gives the logits of the same model whose weights were replaced
by those dequantized values (only the kernels' 8-bit activations differ).
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType
from gguf.quants import Q4_K, dequantize, quantize

from localchat.backends import RunnerOptions
from localchat.backends.torch.cpu import kernels as cpu_kernels
from localchat.backends.torch.cpu.isq import quantize_weight
from localchat.backends.torch.cpu.kernels import BlockMatrix
from localchat.backends.torch.runner import TorchRunner
from localchat.errors import BackendUnavailableError
from localchat.models.memory import estimate
from localchat.weights.block_quantize import quantize_q4_0, quantize_q4_k, quantize_q5_0, quantize_q8_0
from localchat.weights.bundle import ModelBundle
from localchat.weights.isq_plan import BLOCK_TYPES, block_type, is_head
from localchat.weights.loader import load_model
from localchat.weights.tensors import WeightTensor
from tests.backends.test_kernels_model import NEAR_TIE
from tests.helpers.real_model import assert_greedy_tracks, chat_prompts
from tests.helpers.tiny_gguf import random_state_dict, tiny_config, write_tiny_gguf
from tests.helpers.torch_batch import PagedDriver
from tests.helpers.torch_models import TINY_MOE, bundle_from_hf, tiny_hf_model

OPS = cpu_kernels.load()
needs_kernels = pytest.mark.skipif(OPS is None, reason="localchat's CPU kernels are not built")
QUANTIZERS = {"Q8_0": quantize_q8_0, "Q4_K": quantize_q4_k, "Q5_0": quantize_q5_0, "Q4_0": quantize_q4_0}
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _hard_matrix(rows: int = 32, cols: int = 512) -> np.ndarray:
    gen = np.random.default_rng(0)
    matrix = gen.standard_normal((rows, cols)).astype(np.float32) * np.linspace(
        1e-3, 30, cols, dtype=np.float32
    )
    matrix[1, :256] = 0.0  # an all-zero super-block: scales 0
    matrix[2, :32] = 0.7  # a constant sub-block
    matrix[3, 5] = 1e4  # an outlier stretching its block's scale
    matrix[4] = np.abs(matrix[4])  # no negative values: min offset 0
    matrix[5] = -np.abs(matrix[5])
    return matrix


@pytest.mark.parametrize("qtype", ["Q8_0", "Q5_0", "Q4_0"])
def test_bytes_are_ggml_references(qtype: str) -> None:
    matrix = _hard_matrix()
    matrix[6, 0] = 127  # Q8_0's d = 1: the exact halves after it show the rounding rule (away from 0)
    matrix[6, 1:32] = np.arange(31) - 14.5
    matrix[7, 0] = -8  # Q4_0's d = 1: codes land on exact halves, and +8 clips to code 15
    matrix[7, 1:32] = np.linspace(-7.5, 8, 31)
    expected = quantize(matrix, GGMLQuantizationType[qtype])
    assert np.array_equal(QUANTIZERS[qtype](matrix), expected)


@needs_kernels
@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K", "Q5_0", "Q4_0"])
def test_gguf_and_our_kernels_read_the_same_values(qtype: str) -> None:
    assert OPS is not None
    matrix = _hard_matrix()
    blocks = QUANTIZERS[qtype](matrix)
    reference = dequantize(blocks, GGMLQuantizationType[qtype]).reshape(matrix.shape)
    seg = cpu_kernels.Segment(qtype, torch.from_numpy(blocks))
    ours = OPS.dequantize_rows(seg, matrix.shape[1], torch.arange(matrix.shape[0]), torch.float32)
    assert np.array_equal(ours.numpy(), reference)


def test_q4_k_within_half_a_step() -> None:
    matrix = _hard_matrix()
    blocks = quantize_q4_k(matrix)
    back = dequantize(blocks, GGMLQuantizationType.Q4_K).reshape(matrix.shape)
    raw = blocks.reshape(-1, 144)
    d = raw[:, 0:2].copy().view(np.float16).astype(np.float32)  # [blocks, 1]
    sc, _ = Q4_K.get_scale_min(raw[:, 4:16].copy())
    step = np.repeat(d * sc.astype(np.float32), 32, axis=1).reshape(matrix.shape)
    # Half a step, plus float16 rounding of d (2^-11 of a 15-step span) and float32 arithmetic.
    assert np.all(np.abs(back - matrix) <= step * (0.5 + 15 * 2.0**-11) + 1e-6 * np.abs(matrix))
    assert np.array_equal(back[1, :256], np.zeros(256, np.float32))


@pytest.mark.parametrize(
    ("qtype", "low", "high"), [("Q8_0", 0.003, 0.008), ("Q4_K", 0.06, 0.09), ("Q4_0", 0.075, 0.1)]
)
def test_relative_error_on_gaussian_weights(qtype: str, low: float, high: float) -> None:
    """RMS error / RMS value: 8 bits per 32 values ~ amax/127/sqrt(12); 4 bits over the sub-block's
    range (~4.5 sigma for 32 normal values) ~ range/15/sqrt(12) ~ 0.08; Q4_0's steps of amax/8
    (amax ~2.3 sigma) ~ 0.29/sqrt(12) ~ 0.083, a little above Q4_K's (measured 0.086 vs 0.080)."""
    matrix = np.random.default_rng(1).standard_normal((256, 1024)).astype(np.float32) * 0.02
    back = dequantize(QUANTIZERS[qtype](matrix), GGMLQuantizationType[qtype]).reshape(matrix.shape)
    rel = float(np.sqrt(((back - matrix) ** 2).mean() / (matrix**2).mean()))
    assert low < rel < high


@needs_kernels
def test_quantizing_a_matrix_never_holds_it_in_float32() -> None:
    assert OPS is not None
    source = np.random.default_rng(2).standard_normal((2048, 2048)).astype(np.float32)  # 16 MiB
    bf16 = (source.view(np.uint32) >> 16).astype(np.uint16)  # as safetensors hands BF16: 8 MiB
    tracemalloc.start()
    try:
        matrix = quantize_weight(WeightTensor("w", bf16.shape, "BF16", bf16), "Q4_K", OPS)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert matrix.nbytes == 2048 * 2048 // 256 * 144  # 2.25 MiB of blocks
    # The blocks plus one slice's temporaries (a full float32 copy alone would be 16 MiB).
    assert peak < matrix.nbytes + 6 * 2**20, peak


def _logits(runner: TorchRunner) -> torch.Tensor:
    driver = PagedDriver(runner)
    for i, prompt in enumerate([[5, 9, 30, 44, 2, 17, 8], [60, 61, 200, 3]]):
        driver.add(f"r{i}", prompt)
    return driver.step_logits(every_token=True)[1].float()


def _dequantized(values: torch.Tensor, qtype: str) -> torch.Tensor:
    blocks = QUANTIZERS[qtype](values.numpy())
    back = dequantize(blocks, GGMLQuantizationType[qtype]).reshape(values.shape)
    return torch.from_numpy(np.ascontiguousarray(back))


@needs_kernels
@pytest.mark.parametrize(
    ("isq", "qtype", "cosine_to_fp32"),
    [("q8_0", "Q8_0", 0.99), ("q4_k", "Q4_K", 0.85), ("q4_0", "Q4_0", 0.7)],
)
def test_isq_model_runs_blocks_and_matches_its_dequantized_weights(
    isq: str, qtype: str, cosine_to_fp32: float
) -> None:
    hf = tiny_hf_model("llama", hidden_size=256, intermediate_size=512)  # rows of 256: Q4_K applies
    fp32 = _logits(TorchRunner(bundle_from_hf(hf), RunnerOptions(device="cpu", dtype="float32")))
    runner = TorchRunner(bundle_from_hf(hf), RunnerOptions(device="cpu", dtype="bfloat16", isq=isq))
    for layer in runner.model.layers:
        for matrix in (layer.qkv, layer.o, layer.gate_up, layer.down):
            assert isinstance(matrix, BlockMatrix) and [s.qtype for s in matrix.segments] == [qtype]
    for table in (runner.model.embed, runner.model.lm_head):  # the output layer stays at 8 bits
        assert isinstance(table, BlockMatrix) and [s.qtype for s in table.segments] == ["Q8_0"]
    assert f"quantized to {qtype} at load" in runner.device_name
    got = _logits(runner)

    with torch.no_grad():  # the reference: every weight replaced by the values its blocks hold
        for name, param in hf.named_parameters():
            kind = name.split(".")[-2]
            if kind in LINEARS or kind in ("embed_tokens", "lm_head"):
                param.copy_(_dequantized(param, qtype if kind in LINEARS else "Q8_0"))
    expected = _logits(TorchRunner(bundle_from_hf(hf), RunnerOptions(device="cpu", dtype="float32")))
    # Only activations differ: bf16 between layers and 8 bits per 32 values inside the kernels.
    assert float(F.cosine_similarity(got, expected, dim=-1).min()) > 0.995
    top2 = expected.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 0.05 * expected.abs().max(dim=-1).values
    assert bool(clear.any())
    assert torch.equal(got.argmax(-1)[clear], expected.argmax(-1)[clear])
    # Against the unquantized model: this random model's wide weights make it far more sensitive to
    # weight noise than a trained one (its q4_k greedy picks agree on ~half the positions; q4_0, symmetric
    # and so coarser, measured a minimum cosine of 0.74 against q4_k's ~0.9).
    assert float(F.cosine_similarity(got, fp32, dim=-1).min()) > cosine_to_fp32


@needs_kernels
def test_q4_k_falls_back_to_q5_0_for_rows_it_cannot_split() -> None:
    hf = tiny_hf_model("llama", intermediate_size=256)  # hidden 64: no multiple of 256; down's rows are
    runner = TorchRunner(bundle_from_hf(hf), RunnerOptions(device="cpu", dtype="float32", isq="q4_k"))
    layer = runner.model.layers[0]
    for matrix, qtype in ((layer.qkv, "Q5_0"), (layer.gate_up, "Q5_0"), (layer.down, "Q4_K")):
        assert isinstance(matrix, BlockMatrix) and [s.qtype for s in matrix.segments] == [qtype]


@pytest.mark.parametrize(
    ("env", "value", "why"),
    [
        ("LOCALCHAT_KERNELS", "off", "kernels are off or not built"),
        ("LOCALCHAT_TORCH_QUANT", "dequant", "LOCALCHAT_TORCH_QUANT=dequant is set"),
    ],
)
def test_block_isq_without_our_kernels_is_refused(
    monkeypatch: pytest.MonkeyPatch, env: str, value: str, why: str
) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(
        BackendUnavailableError, match=f"--isq q8_0 runs on localchat's compiled CPU kernels.*{why}"
    ):
        TorchRunner(
            bundle_from_hf(tiny_hf_model("llama")), RunnerOptions(device="cpu", dtype="float32", isq="q8_0")
        )


def _runtime_weight_bytes(runner: TorchRunner) -> int:
    """Bytes of every parameter and block matrix the loaded model holds; the q/k norms counted as stored (one
    row each: the load broadcasts them to a row per head, `qk_norm`, a few KB the estimate does not see)."""
    total = 0
    for module in runner.model.modules():
        for name, p in module._parameters.items():
            total += 0 if p is None else 2 * p[0].nbytes if name == "qk_norm" else p.nbytes
        total += sum(v.nbytes for v in vars(module).values() if isinstance(v, BlockMatrix))
    return total


@needs_kernels
@pytest.mark.parametrize("isq", ["q8_0", "q4_k", "q4_0"])
@pytest.mark.parametrize(
    ("model_type", "hidden"),  # 96: Q4_K's rows fall back to Q5_0 (down's 256 stay Q4_K)
    [("llama", 256), ("llama", 96), ("qwen3_moe", 96), ("phi3", 96), ("gemma3_text", 96)],
)
def test_memory_estimate_is_what_the_isq_model_holds(
    tmp_path: Path, isq: str, model_type: str, hidden: int
) -> None:
    """The pre-load RAM check (models/memory.py) sizes a safetensors folder exactly as the backend
    quantizes it (stacked MoE experts each a matrix, the router dense; phi3's fused q|k|v): an estimate
    that ignored --isq would be the bf16 size, ~2-3.5x more."""
    moe = TINY_MOE if model_type == "qwen3_moe" else {}
    hf = tiny_hf_model(model_type, hidden_size=hidden, intermediate_size=256, **moe)
    hf.to(torch.bfloat16).save_pretrained(tmp_path)  # as checkpoints ship: bf16
    hf.float()
    runner = TorchRunner(bundle_from_hf(hf), RunnerOptions(device="cpu", dtype="bfloat16", isq=isq))
    assert estimate(tmp_path, None, isq).weights == _runtime_weight_bytes(runner)


@needs_kernels
@pytest.mark.parametrize("isq", ["q8_0", "q4_k", "q4_0"])
def test_memory_estimate_of_a_float_gguf_under_isq(tmp_path: Path, isq: str) -> None:
    """An F16 GGUF file is dense too: --isq quantizes it, and the RAM check sizes it so."""
    cfg = tiny_config("llama", hidden_size=96, head_dim=24, intermediate_size=256)
    path = write_tiny_gguf(tmp_path / "tiny-F16.gguf", random_state_dict(cfg), cfg, "F16")
    runner = TorchRunner(load_model(path), RunnerOptions(device="cpu", dtype="bfloat16", isq=isq))
    norms = (2 * cfg["num_hidden_layers"] + 1) * cfg["hidden_size"]  # F32 in the file, bf16 once loaded
    assert estimate(path, None, isq).weights == _runtime_weight_bytes(runner) + 2 * norms


def _dense_bundle(gguf: Path, as_isq: str | None = None) -> ModelBundle:
    """The GGUF model as a dense float32 checkpoint (what a safetensors folder hands the runner);
    `as_isq`: every matrix replaced by the values `--isq as_isq` would give it (the fp32 reference)."""
    bundle = load_model(gguf)
    source = bundle.iter_weights

    def dense() -> Iterator[WeightTensor]:
        for w in source():
            values = w.dequantize()
            qtype = block_type(BLOCK_TYPES[as_isq], w.shape, is_head(w.name)) if as_isq else None
            if qtype is not None:
                values = dequantize(QUANTIZERS[qtype](values), GGMLQuantizationType[qtype]).reshape(w.shape)
            yield WeightTensor(w.name, w.shape, "F32", np.ascontiguousarray(values, dtype=np.float32))

    return replace(bundle, format="safetensors", iter_weights=dense)


@needs_kernels
@pytest.mark.slow
def test_smollm2_dense_with_isq_q8_0_tracks_the_fp32_reference(smollm2_gguf: Path) -> None:
    """Greedy tokens identical to the fp32 run until a near-tie (the kernel tests' NEAR_TIE rule: Q8_0 on
    top of the dense values adds ~0.5% weight noise to the 8-bit activations' rounding)."""
    bundle = _dense_bundle(smollm2_gguf)
    prompts = chat_prompts(bundle)
    ours = TorchRunner(bundle, RunnerOptions(device="cpu", dtype="bfloat16", isq="q8_0"))
    assert isinstance(ours.model.layers[0].qkv, BlockMatrix)
    fp32 = TorchRunner(_dense_bundle(smollm2_gguf), RunnerOptions(device="cpu", dtype="float32"))
    assert_greedy_tracks(ours, fp32, bundle, prompts, NEAR_TIE, "isq")


@needs_kernels
@pytest.mark.slow
def test_smollm2_dense_with_isq_q4_0_tracks_its_dequantized_fp32_reference(smollm2_gguf: Path) -> None:
    """4 bits move greedy picks of the dense model itself, so the reference is the fp32 model whose
    weights are the values the blocks hold: only the kernels' 8-bit activations and bf16 differ."""
    bundle = _dense_bundle(smollm2_gguf)
    prompts = chat_prompts(bundle)
    ours = TorchRunner(bundle, RunnerOptions(device="cpu", dtype="bfloat16", isq="q4_0"))
    qkv = ours.model.layers[0].qkv
    assert isinstance(qkv, BlockMatrix) and [s.qtype for s in qkv.segments] == ["Q4_0"]
    fp32 = TorchRunner(_dense_bundle(smollm2_gguf, "q4_0"), RunnerOptions(device="cpu", dtype="float32"))
    assert_greedy_tracks(ours, fp32, bundle, prompts, NEAR_TIE, "isq")
