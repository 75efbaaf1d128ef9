"""MoE expert stacks on MLX stay in the MLX form their type has for dense layers (backends/mlx/models/moe.py):
gather_qmm over affine groups (exact GGUF types, the re-quantized K- and i-quants, TQ, Q1_0 / Q2_0), "nvfp4"
and "mxfp4". Tiny Qwen3-MoE GGUFs in each type against transformers on the values the file holds (exact
types) or the values MLX keeps (re-quantized types, each within half a step of the file's), greedy tokens
equal; the stacks asserted quantized, so a dense fallback fails here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

mx = pytest.importorskip("mlx.core")

from localchat.arch.moe import MoeSpec  # noqa: E402
from localchat.backends.mlx.models.moe import RowStacks, SparseMoe, _arrays  # noqa: E402
from localchat.backends.mlx.quant import REQUANTIZED, DenseWeight, QuantizedWeight, take_rows, to_weight  # noqa: E402
from localchat.models import memory  # noqa: E402
from localchat.weights.experts import split_experts  # noqa: E402
from localchat.weights.hf_quant_blocks import RepackedLinear  # noqa: E402
from localchat.weights.loader import load_model  # noqa: E402
from localchat.weights.tensors import WeightTensor  # noqa: E402
from tests.backends.test_moe import hf_state, hf_state_per_expert  # noqa: E402
from tests.helpers.iquants import random_blocks  # noqa: E402
from tests.helpers.parity import ATOL, GREEDY, PROMPT, Driver, hf_generate, mlx_runner  # noqa: E402
from tests.helpers.parity import hf_logits_np as hf_logits  # noqa: E402
from tests.helpers.tiny_gguf import TINY_VOCAB_SIZE, write_tiny_gguf  # noqa: E402
from tests.helpers.torch_models import tiny_hf_model  # noqa: E402

pytestmark = pytest.mark.mlx

# type -> (mode, bits, group size) of its MLX form
EXACT = {
    "Q4_0": ("affine", 4, 32),
    "Q4_1": ("affine", 4, 32),
    "Q5_0": ("affine", 5, 32),
    "Q5_1": ("affine", 5, 32),
    "Q8_0": ("affine", 8, 32),
    "Q4_K": ("affine", 4, 32),
    "Q5_K": ("affine", 5, 32),
    "TQ1_0": ("affine", 2, 32),
    "TQ2_0": ("affine", 2, 32),
    "Q1_0": ("affine", 1, 128),
    "Q2_0": ("affine", 2, 64),
    "NVFP4": ("nvfp4", 4, 16),
    "MXFP4": ("mxfp4", 4, 32),
}
# written by the tiny GGUF writer's encoders; the other i-quants are covered below on random blocks
REQUANT_WRITTEN = ["Q6_K", "Q3_K", "Q2_K", "IQ4_NL", "IQ4_XS"]
FORMS = EXACT | {q: ("affine", REQUANTIZED[q], 32) for q in REQUANTIZED}
EXPERTS, WIDTH = 4, 256  # K-quants / TQ need 256-wide rows, in both the gate|up and the down matrices


def kept_values(weight: WeightTensor) -> np.ndarray:
    """The values MLX holds for one 2-D weight: the file's own (exact types) or the re-quantized ones."""
    if weight.dtype not in REQUANTIZED or weight.dtype in ("TQ1_0", "TQ2_0"):
        return np.array(weight.dequantize())
    held = to_weight(weight, mx.float32)
    assert isinstance(held, QuantizedWeight)
    return np.array(take_rows(held, mx.arange(weight.shape[0]))).reshape(weight.shape)


def held_bytes(runner: Any) -> int:
    """The nbytes of every array the checkpoint filled: top-level, each layer's declared weights, and its
    expert stacks and router (as tests/backends/test_mlx_gguf_memory.py counts, nvfp4's absent biases too)."""

    def arrays(value: object) -> list[Any]:
        if isinstance(value, list):
            return [a for v in value for a in arrays(v)]
        if isinstance(value, QuantizedWeight | RowStacks):
            return _arrays(value)
        if isinstance(value, DenseWeight):
            return [value.wt]
        return [] if value is None else [value]

    model = runner.model
    found = arrays([model.embed, model.norm, model.lm_head])
    for layer in model.layers:
        found += arrays([getattr(layer, attr) for attr in {k.split(".")[0] for k in layer.shapes}])
        found += arrays([layer.moe.gate_up, layer.moe.down, layer.moe.router])
    return sum(a.nbytes for a in {id(a): a for a in found}.values())


def within_half_step(kept: np.ndarray, file: np.ndarray, bits: int) -> bool:
    groups = file.reshape(file.shape[0], -1, 32)
    half = (groups.max(-1) - groups.min(-1)) / (2**bits - 1) / 2
    error = np.abs(kept - file).reshape(groups.shape).max(-1)
    return bool((error <= half * 1.01 + 1e-7).all())


@pytest.mark.parametrize("qtype", [*EXACT, *REQUANT_WRITTEN])
def test_tiny_moe_gguf_experts_stay_quantized(tmp_path: Path, qtype: str) -> None:
    hf = tiny_hf_model(
        "qwen3_moe",
        vocab_size=TINY_VOCAB_SIZE,
        hidden_size=WIDTH,
        head_dim=64,
        num_experts=EXPERTS,
        num_experts_per_tok=2,
        moe_intermediate_size=WIDTH,
        norm_topk_prob=True,
    )
    path = write_tiny_gguf(tmp_path / f"moe-{qtype}.gguf", hf, qtype=qtype, tokenizer_kind="gpt2")
    bundle = load_model(path)
    weights = list(bundle.iter_weights())
    stacked = [w for w in weights if ".experts." in w.name]
    assert len(stacked) == 2 * 3 and all(w.dtype == qtype and w.shape[0] == EXPERTS for w in stacked)
    reference: dict[str, np.ndarray] = {}
    for w in weights:
        matrices = list(split_experts([w])) if len(w.shape) == 3 else [w]
        kept = [kept_values(m) for m in matrices]
        if w.dtype in REQUANTIZED and w.dtype not in ("TQ1_0", "TQ2_0"):  # the stated error, per value
            assert all(
                within_half_step(k, np.array(m.dequantize()), REQUANTIZED[w.dtype])
                for k, m in zip(kept, matrices, strict=True)
            )
        reference[w.name] = np.stack(kept) if len(w.shape) == 3 else kept[0]
    missing, unexpected = hf.load_state_dict(
        hf_state([WeightTensor(n, v.shape, "F32", v) for n, v in reference.items()]), strict=False
    )
    assert not unexpected and set(missing) <= {"lm_head.weight"}

    runner = mlx_runner(bundle)
    mode, bits, group = FORMS[qtype]
    for layer in runner.model.layers:
        for stack, rows in ((layer.moe.gate_up, 2 * WIDTH), (layer.moe.down, WIDTH)):
            # held quantized (a dense stack fails here): `bits` a value, uint32 words
            assert isinstance(stack, QuantizedWeight) and stack.packed.dtype == mx.uint32
            assert (stack.mode, stack.bits, stack.group_size) == (mode, bits, group)
            assert stack.packed.shape == (EXPERTS, rows, WIDTH * bits // 32)
    held = held_bytes(runner)
    estimate = memory.estimate(path, kv_cache_mib=0, dtype="float32", backend="mlx").weights
    assert abs(estimate - held) <= 0.01 * held  # the pre-load RAM check sizes the stacks as held

    prompt = PROMPT * 2
    driver = Driver(runner)
    driver.add("a", prompt, GREEDY)
    _, logits = driver.step_logits(every_token=True)
    assert np.abs(logits - hf_logits(hf, prompt)).max() < ATOL
    driver.feed("a", int(logits[-1].argmax()))
    for _ in range(5):
        driver.step()
    assert driver.tokens("a")[len(prompt) :] == hf_generate(hf, prompt, 6)[:6]


def _moe(gate_up: list[list[WeightTensor]], down: list[WeightTensor], hidden: int, size: int) -> SparseMoe:
    spec = MoeSpec(len(down), 2, True, size, frozenset({0}))
    moe = SparseMoe(spec, hidden)
    rng = np.random.default_rng(5)
    router = rng.standard_normal((len(down), hidden)).astype(np.float32)
    moe.router = to_weight(WeightTensor("r", router.shape, "F32", router), mx.float32)
    for expert, parts, d in zip(moe.experts, gate_up, down, strict=True):
        held = [to_weight(p, mx.float32) for p in parts]
        expert.gate_up = held[0] if len(held) == 1 else held
        expert.down = to_weight(d, mx.float32)
    return moe


def _reference(
    moe_router: np.ndarray, gate_up: list[np.ndarray], down: list[np.ndarray], x: np.ndarray
) -> np.ndarray:
    """Top-2 renormalised SwiGLU experts on dense float64 values."""
    out = np.zeros_like(x, dtype=np.float64)
    for t in range(x.shape[0]):
        logits = moe_router @ x[t]
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        top = np.argsort(-probs)[:2]
        for e in top:
            h = gate_up[e] @ x[t]
            gate, up = np.split(h, 2)
            out[t] += probs[e] / probs[top].sum() * (down[e] @ (gate * 0.5 * (1 + np.tanh(gate / 2)) * up))
    return out


@pytest.mark.parametrize("qtype", ["IQ3_S", "IQ3_XXS", "IQ2_S", "IQ2_XS", "IQ2_XXS", "IQ1_M", "IQ1_S"])
@pytest.mark.parametrize("tokens", [3, 40])  # below and above SORT_FROM_PAIRS (sorted gather)
def test_iquant_expert_stacks_gather_the_kept_values(qtype: str, tokens: int) -> None:
    """i-quants without an encoder here: random valid blocks per expert, re-quantized as the dense path
    does (within half a step), stacked at REQUANTIZED bits; the block's output is the kept values'."""
    hidden = size = WIDTH
    gate_up = [
        WeightTensor("gu", (2 * size, hidden), qtype, random_blocks(qtype, 2 * size, hidden, e))
        for e in range(3)
    ]
    down = [
        WeightTensor("d", (hidden, size), qtype, random_blocks(qtype, hidden, size, 10 + e)) for e in range(3)
    ]
    moe = _moe([[g] for g in gate_up], down, hidden, size)
    router = np.array(moe.router.wt).T  # type: ignore[union-attr]
    kept_gu, kept_down = [kept_values(g) for g in gate_up], [kept_values(d) for d in down]
    for kept, w in zip(kept_gu + kept_down, gate_up + down, strict=True):
        assert within_half_step(kept, np.array(w.dequantize()), REQUANTIZED[qtype])
    moe.finish()
    for stack in (moe.gate_up, moe.down):
        assert isinstance(stack, QuantizedWeight) and (stack.bits, stack.group_size) == (
            REQUANTIZED[qtype],
            32,
        )
    x = np.random.default_rng(7).standard_normal((tokens, hidden)).astype(np.float32)
    out = np.array(moe.forward(mx.array(x)))
    expected = _reference(router, kept_gu, kept_down, x)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


def test_gate_and_up_in_different_types_stack_apart_quantized() -> None:
    """A Q4_0 gate beside a Q8_0 up (no fused form) and an NVFP4 down: gate and up each a quantized stack
    (RowStacks), outputs side by side; the block's output is the file values'."""
    from tests.helpers.lowbit import random_lowbit_blocks

    hidden, size, experts = 128, 64, 3
    rng = np.random.default_rng(9)

    def blocks(qtype: str, rows: int, cols: int) -> WeightTensor:
        from gguf import GGMLQuantizationType
        from gguf.quants import quantize

        if qtype == "NVFP4":
            return WeightTensor(
                "w", (rows, cols), qtype, random_lowbit_blocks(qtype, rows, cols, int(rng.integers(99)))
            )
        values = (0.1 * rng.standard_normal((rows, cols))).astype(np.float32)
        return WeightTensor("w", (rows, cols), qtype, quantize(values, GGMLQuantizationType[qtype]))

    gate_up = [[blocks("Q4_0", size, hidden), blocks("Q8_0", size, hidden)] for _ in range(experts)]
    down = [blocks("NVFP4", hidden, size) for _ in range(experts)]
    moe = _moe(gate_up, down, hidden, size)
    router = np.array(moe.router.wt).T  # type: ignore[union-attr]
    moe.finish()
    assert isinstance(moe.gate_up, RowStacks)
    assert [(p.bits, p.mode) for p in moe.gate_up.parts if isinstance(p, QuantizedWeight)] == [
        (4, "affine"),
        (8, "affine"),
    ]
    assert isinstance(moe.down, QuantizedWeight) and moe.down.mode == "nvfp4" and moe.down.biases is None
    file_gu = [np.concatenate([np.array(p.dequantize()) for p in parts]) for parts in gate_up]
    file_down = [np.array(d.dequantize()) for d in down]
    for tokens in (2, 40):
        x = rng.standard_normal((tokens, hidden)).astype(np.float32)
        expected = _reference(router, file_gu, file_down, x)
        np.testing.assert_allclose(
            np.array(moe.forward(mx.array(x))), expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max()
        )


@pytest.mark.parametrize("qtype", ["NVFP4", "Q4_K", "MXFP4"])
def test_bfloat16_stacks_stay_quantized_and_track_float32(tmp_path: Path, qtype: str) -> None:
    """bfloat16 compute (Metal's dtype, forced on CPU): the stacks keep the same form (affine scales in
    bfloat16, nvfp4 / mxfp4 scale bytes as they are) and the logits track the float32 run's."""
    hf = tiny_hf_model(
        "qwen3_moe",
        vocab_size=TINY_VOCAB_SIZE,
        hidden_size=WIDTH,
        head_dim=64,
        num_experts=EXPERTS,
        num_experts_per_tok=2,
        moe_intermediate_size=WIDTH,
        norm_topk_prob=True,
    )
    bundle = load_model(write_tiny_gguf(tmp_path / "moe.gguf", hf, qtype=qtype, tokenizer_kind="gpt2"))
    logits = {}
    for dtype in ("float32", "bfloat16"):
        runner = mlx_runner(bundle, dtype)
        stack = runner.model.layers[0].moe.gate_up
        assert isinstance(stack, QuantizedWeight) and stack.mode == FORMS[qtype][0]
        driver = Driver(runner)
        driver.add("a", PROMPT)
        logits[dtype] = driver.step_logits(every_token=True)[1]
    a, b = logits["float32"], logits["bfloat16"]
    cosine = (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
    # measured 0.981 at worst (Q4_K; stacks forced dense float32 on the same file: 0.963): routing in bf16
    assert cosine.min() > 0.97


def test_experts_of_different_types_stack_dense_with_their_values() -> None:
    """gather_qmm takes one form per stack: experts in different types (no GGUF stack holds those; a
    hub folder could) stack dense, float32 on MLX's CPU, with each expert's own values."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    hidden, size = 64, 32
    rng = np.random.default_rng(4)

    def blocks(qtype: str, rows: int, cols: int) -> WeightTensor:
        values = (0.1 * rng.standard_normal((rows, cols))).astype(np.float32)
        return WeightTensor("w", (rows, cols), qtype, quantize(values, GGMLQuantizationType[qtype]))

    types = ["Q4_0", "Q8_0", "Q4_0"]
    gate_up = [blocks(q, 2 * size, hidden) for q in types]
    down = [blocks(q, hidden, size) for q in types]
    moe = _moe([[g] for g in gate_up], down, hidden, size)
    router = np.array(moe.router.wt).T  # type: ignore[union-attr]
    moe.finish()
    assert isinstance(moe.gate_up, DenseWeight) and moe.gate_up.wt.dtype == mx.float32
    x = rng.standard_normal((3, hidden)).astype(np.float32)
    expected = _reference(router, [g.dequantize() for g in gate_up], [d.dequantize() for d in down], x)
    np.testing.assert_allclose(np.array(moe.forward(mx.array(x))), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.filterwarnings("ignore:overflow encountered")
def test_mxfp4_linear_maps_exactly_onto_mlx_mxfp4() -> None:
    """A GGUF MXFP4 matrix outside gpt-oss's expert path (a dense layer, or another family's experts):
    MLX's mxfp4 mode, the e8m0 byte as its scale, every value equal to the file's (exponent bytes 0, 1
    and 254 included: the smallest scales, and products past float32's range, inf on both sides)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    rows, cols = 8, 256
    values = np.random.default_rng(3).standard_normal((rows, cols)).astype(np.float32)
    blocks = quantize(values, GGMLQuantizationType.MXFP4)
    blocks.reshape(-1, 17)[:3, 0] = [0, 1, 254]  # the smallest and largest finite exponents
    weight = to_weight(WeightTensor("w", (rows, cols), "MXFP4", blocks), mx.float32)
    assert isinstance(weight, QuantizedWeight) and (weight.mode, weight.bits, weight.group_size) == (
        "mxfp4",
        4,
        32,
    )
    reference = WeightTensor("w", (rows, cols), "MXFP4", blocks).dequantize()
    np.testing.assert_array_equal(np.array(take_rows(weight, mx.arange(rows))), reference)
    assert weight.packed.nbytes + weight.scales.nbytes == blocks.nbytes  # 4.25 bits a weight, as the file


def _hf_cases() -> dict[str, tuple[Any, dict[str, Any], tuple[str, int, int]]]:
    from tests.backends.test_hf_nvfp4 import (
        COMPRESSED_CONFIG,
        MODELOPT_CONFIG,
        compressed_quantizer,
        modelopt_quantizer,
    )
    from tests.backends.test_hf_quant import CASES

    return {
        "gptq-g32": (*CASES["gptq-g32"], ("affine", 4, 32)),
        "awq-g32": (*CASES["awq-g32"], ("affine", 4, 32)),
        "ct-w4a16-g32": (*CASES["ct-w4a16-g32"], ("affine", 4, 32)),
        "modelopt-nvfp4": (modelopt_quantizer, MODELOPT_CONFIG, ("nvfp4", 4, 16)),
        "ct-nvfp4": (compressed_quantizer, COMPRESSED_CONFIG, ("nvfp4", 4, 16)),
    }


@pytest.mark.parametrize("case", ["gptq-g32", "awq-g32", "ct-w4a16-g32", "modelopt-nvfp4", "ct-nvfp4"])
def test_quantized_hf_moe_folder_experts_stay_quantized(tmp_path: Path, case: str) -> None:
    """A Hugging Face Qwen3-MoE folder with per-expert names (the hub's form) in GPTQ / AWQ /
    compressed-tensors int4 / ModelOpt and compressed-tensors NVFP4: every expert matrix arrives as GGUF
    blocks (weights/hf_quant.py, hf_nvfp4.py) and the stacks keep MLX's form of them; logits equal
    transformers' on the checkpoint's values (as repacked)."""
    from tests.helpers.parity import tiny_tokenizer_json
    from tests.helpers.quant_folders import quantize_tensors, save_quantized

    quantizer, qconfig, form = _hf_cases()[case]
    hf = tiny_hf_model(
        "qwen3_moe",
        hidden_size=128,
        head_dim=32,
        num_experts=EXPERTS,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        norm_topk_prob=True,
    )
    hf.save_pretrained(tmp_path)  # type: ignore[operator]
    named: list[tuple[str, torch.Tensor]] = []
    for name, tensor in hf.state_dict().items():
        prefix = name.removesuffix("gate_up_proj").removesuffix("down_proj")
        if name.endswith("experts.gate_up_proj"):
            gate, up = tensor.chunk(2, dim=1)
            for e in range(EXPERTS):
                named += [(f"{prefix}{e}.gate_proj.weight", gate[e]), (f"{prefix}{e}.up_proj.weight", up[e])]
        elif name.endswith("experts.down_proj"):
            named += [(f"{prefix}{e}.down_proj.weight", tensor[e]) for e in range(EXPERTS)]
        else:
            named.append((name, tensor))

    def linears(name: str, tensor: torch.Tensor) -> Any:
        return quantizer if "layers." in name and name.endswith("_proj.weight") else None

    state, _ = quantize_tensors(named, linears)
    save_quantized(tmp_path, state, qconfig, tiny_tokenizer_json())
    bundle = load_model(tmp_path)
    # the reference: the values as handed over (GGUF blocks; their error against the checkpoint is
    # weights/hf_quant.py's and hf_nvfp4.py's to state), experts restacked for transformers
    stream = list(bundle.iter_weights())
    assert sum(isinstance(w, RepackedLinear) or w.dtype == "NVFP4" for w in stream) == 2 * (3 * EXPERTS + 4)
    values = [w.blocks() if isinstance(w, RepackedLinear) else w for w in stream]
    exact = [WeightTensor(w.name, w.shape, "F32", np.array(w.dequantize())) for w in values]
    missing, unexpected = hf.load_state_dict(hf_state_per_expert(exact), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}

    runner = mlx_runner(bundle)
    for layer in runner.model.layers:
        for stack in (layer.moe.gate_up, layer.moe.down):
            assert isinstance(stack, QuantizedWeight) and stack.packed.shape[0] == EXPERTS
            assert (stack.mode, stack.bits, stack.group_size) == form
    driver = Driver(runner)
    driver.add("a", PROMPT)
    _, logits = driver.step_logits(every_token=True)
    assert np.abs(logits - hf_logits(hf, PROMPT)).max() < ATOL
