"""GGUF NVFP4, Q1_0 and Q2_0 (localchat/weights/lowbit.py, csrc/lc_lowbit.h) on localchat's CPU kernels.

- Fixed blocks with hand-computed values (from the formats' definitions) dequantize to exactly those
  values, in numpy and in the kernels: the proof CI runs without llama.cpp.
- The numpy reference equals the gguf package's NVFP4 dequantizer and, where llama.cpp's libggml-base is
  found (LOCALCHAT_GGML_LIB, else the dev box's build), ggml's own to_float for all three, bit for bit,
  over every scale byte; the kernels' dequantization equals it bit for bit.
- Matmul on every ISA this host runs stays within the float32 accumulation bound of the float64 product of
  the dequantized weights and the kernels' own 8-bit activations (as test_kernels_iquants.py), the
  block-at-a-time row kernels (csrc/lc_lowbit_rows.h) over 1-6 blocks, 1-4 rows and the codes' and scales'
  extremes; NEON runs under qemu in test_iquants_neon.py.
- A tiny Llama GGUF with every matrix in one of the types keeps them in blocks and follows the
  dequantized float32 run.
"""

from __future__ import annotations

import ctypes
import glob
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from localchat.backends.torch.cpu import kernels
from localchat.weights.lowbit import LOWBIT_TYPES, dequantize_lowbit
from tests.helpers.kernel_checks import (
    check_matmul_bound,
    compact_and_dequantized,
    follow_dequantized,
    quantized_activations,
    tiny_model_matrices,
)
from tests.helpers.lowbit import LOWBIT_QUANTIZERS, random_lowbit_blocks, ue4m3_from_float
from tests.helpers.torch_batch import PagedDriver
from tests.helpers.torch_models import tiny_hf_model

TYPES = sorted(LOWBIT_TYPES)
needs_kernels = pytest.mark.skipif(not kernels.runnable_isas(), reason="kernels not built (no C compiler)")


def _f16(value: float) -> list[int]:
    return list(np.array([value], dtype=np.float16).view(np.uint8))


def fixed_blocks() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """One block per type and the values its definition gives (worked out by hand)."""
    # NVFP4: scales 0x38 (e 7, m 0: 1.0), 0x41 (e 8, m 1: 2.25), 0x00 (zero), 0x01 (subnormal 2^-9);
    # ggml's table is E2M1 doubled, so each value is table[code] * scale / 2.
    nv_codes = [0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE]  # low nibble: value j, high: j + 8
    nvfp4 = np.array([0x38, 0x41, 0x00, 0x01] + nv_codes * 4, dtype=np.uint8)
    e2m1 = [0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6]
    order = [0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15]  # codes of values 0..15 of each 16
    nv_values = [e2m1[c] * s for s in (1.0, 2.25, 0.0, 2.0**-9) for c in order]
    # Q1_0: d = 0.375, bits 0b10100101 then 0xFF, 0x00, ...: +d where set
    q1 = np.array(_f16(0.375) + [0b10100101, 0xFF, 0x00, 0x0F] * 4, dtype=np.uint8)
    q1_bits = [(byte >> j) & 1 for byte in [0b10100101, 0xFF, 0x00, 0x0F] * 4 for j in range(8)]
    q1_values = [0.375 if bit else -0.375 for bit in q1_bits]
    # Q2_0: d = -1.5, byte 0b11100100 holds codes 0, 1, 2, 3: values (q - 1) d
    q2 = np.array(_f16(-1.5) + [0b11100100, 0b00011011] * 8, dtype=np.uint8)
    q2_codes = [(byte >> (2 * j)) & 3 for byte in [0b11100100, 0b00011011] * 8 for j in range(4)]
    q2_values = [(q - 1) * -1.5 for q in q2_codes]
    return {
        "NVFP4": (nvfp4, np.array(nv_values, dtype=np.float32)),
        "Q1_0": (q1, np.array(q1_values, dtype=np.float32)),
        "Q2_0": (q2, np.array(q2_values, dtype=np.float32)),
    }


@pytest.mark.parametrize("qtype", TYPES)
def test_fixed_blocks_dequantize_to_their_definition(qtype: str) -> None:
    block, want = fixed_blocks()[qtype]
    assert block.size == LOWBIT_TYPES[qtype][2] and want.size == LOWBIT_TYPES[qtype][1]
    assert np.array_equal(dequantize_lowbit(block, qtype), want)


@needs_kernels
@pytest.mark.parametrize("qtype", TYPES)
def test_kernels_dequantize_fixed_blocks(qtype: str) -> None:
    ops = kernels.load("portable")
    assert ops is not None
    block, want = fixed_blocks()[qtype]
    rows = np.stack([block, block[::-1].copy()])  # a second row of other bytes: row addressing
    seg = kernels.Segment(qtype, torch.from_numpy(rows))
    got = ops.dequantize_rows(seg, want.size, torch.tensor([1, 0]), torch.float32).numpy()
    assert np.array_equal(got[1], want)
    assert np.array_equal(got[0], dequantize_lowbit(rows[1], qtype))


def test_nvfp4_equals_the_gguf_package_bit_for_bit() -> None:
    gguf_quants = pytest.importorskip("gguf.quants")
    if not hasattr(gguf_quants, "NVFP4"):
        pytest.skip("this gguf release has no NVFP4 dequantizer (0.19 has)")
    from gguf import GGMLQuantizationType

    blocks = random_lowbit_blocks("NVFP4", 64, 256, seed=4, any_scale=True)
    blocks.reshape(-1, 36)[:64, :4] = np.arange(256, dtype=np.uint8).reshape(64, 4)  # every scale byte
    want = np.asarray(gguf_quants.dequantize(blocks, GGMLQuantizationType.NVFP4), dtype=np.float32).reshape(
        -1
    )
    assert np.array_equal(dequantize_lowbit(blocks, "NVFP4").view(np.uint32), want.view(np.uint32))
    x = np.abs(np.random.default_rng(0).standard_normal(4096).astype(np.float32)) * 100
    x[:4] = [0, 1e-9, 448, 1e6]
    assert np.array_equal(ue4m3_from_float(x), gguf_quants.NVFP4.fp32_to_ue4m3(x))


def _ggml_lib() -> ctypes.CDLL | None:
    paths = [os.environ.get("LOCALCHAT_GGML_LIB", "")]
    paths += sorted(glob.glob("/tmp/llamacpp/*/build/bin/libggml-base.so"))
    for path in paths:
        if path and Path(path).is_file():
            return ctypes.CDLL(path)
    return None


class _Traits(ctypes.Structure):  # ggml.h's struct ggml_type_traits
    _fields_ = [
        ("type_name", ctypes.c_char_p),
        ("blck_size", ctypes.c_int64),
        ("blck_size_interleave", ctypes.c_int64),
        ("type_size", ctypes.c_size_t),
        ("is_quantized", ctypes.c_bool),
        ("to_float", ctypes.c_void_p),
        ("from_float_ref", ctypes.c_void_p),
    ]


@pytest.mark.parametrize("qtype", TYPES)
def test_reference_equals_llama_cpp_bit_for_bit(qtype: str) -> None:
    lib = _ggml_lib()
    if lib is None:
        pytest.skip(
            "llama.cpp's libggml-base.so not found (set LOCALCHAT_GGML_LIB; CI does not build llama.cpp)"
        )
    lib.ggml_get_type_traits.restype = ctypes.POINTER(_Traits)
    lib.ggml_get_type_traits.argtypes = [ctypes.c_int]
    type_id, values, size = LOWBIT_TYPES[qtype]
    traits = lib.ggml_get_type_traits(type_id).contents
    assert (traits.blck_size, traits.type_size) == (values, size)
    to_float = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(traits.to_float)
    blocks = np.ascontiguousarray(random_lowbit_blocks(qtype, 32, values * 16, seed=9, any_scale=True))
    want = np.zeros(blocks.shape[0] * values * 16, dtype=np.float32)
    to_float(blocks.ctypes.data, want.ctypes.data, want.size)
    assert np.array_equal(dequantize_lowbit(blocks, qtype).view(np.uint32), want.view(np.uint32))


@needs_kernels
@pytest.mark.parametrize("qtype", TYPES)
def test_kernels_dequantize_bit_for_bit(qtype: str) -> None:
    ops = kernels.load("portable")
    assert ops is not None
    cols = 512
    blocks = random_lowbit_blocks(qtype, 8, cols, seed=3, any_scale=True)
    if qtype == "NVFP4":
        blocks[0, :: LOWBIT_TYPES[qtype][2]][:8] = [0, 1, 7, 8, 0x7E, 0x7F, 0x80, 0xFF]  # scale bytes' ends
    ids = torch.arange(8).flip(0)
    want = dequantize_lowbit(blocks, qtype).reshape(8, cols)[ids.numpy()]
    got = ops.dequantize_rows(
        kernels.Segment(qtype, torch.from_numpy(blocks)), cols, ids, torch.float32
    ).numpy()
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@needs_kernels
@pytest.mark.parametrize("isa", kernels.runnable_isas())
@pytest.mark.parametrize("qtype", TYPES)
def test_matmul_matches_the_dequantized_product(qtype: str, isa: str) -> None:
    """Decode (1-4 rows, the row kernel) and prefill shapes (the panel GEMM: a partial 4-row group, more
    than one 64-row chunk), rows of an odd number of 32-value sub-blocks where the type allows, float32 and
    bfloat16 activations and outputs."""
    ops = kernels.load(isa)
    assert ops is not None
    values = LOWBIT_TYPES[qtype][1]
    n, k = 37, values * (7 if values == 64 else 5)
    blocks = random_lowbit_blocks(qtype, n, k, seed=7)
    w = torch.from_numpy(dequantize_lowbit(blocks, qtype).reshape(n, k)).double()
    x16 = qtype != "NVFP4" and isa == "avx512vnni"  # csrc/lc_lowbit_x16.h
    check_matmul_bound(ops, qtype, blocks, w, rows=(1, 2, 3, 4, 5, 70), repacks=x16)


def _within_bound(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor, k: int) -> bool:
    """Whether the kernels' product is within the float32 accumulation bound of the float64 product of the
    dequantized weights and the kernels' own 8-bit activations."""
    xq = quantized_activations(x.float())
    want = xq @ w.T
    bound = (k / 4 + 8) * 2.0**-24 * (xq.abs() @ w.abs().T)
    return bool(((got.double() - want).abs() <= bound + 1e-30).all())


@needs_kernels
@pytest.mark.parametrize("isa", kernels.runnable_isas())
@pytest.mark.parametrize("qtype", TYPES)
def test_row_kernel_every_row_count_and_block_count(qtype: str, isa: str) -> None:
    """The one-row / few-row kernels (Q1_0 and Q2_0 run a block at a time: csrc/lc_lowbit_rows.h) for 1-4
    activation rows over rows of 1 to 6 blocks (Q2_0 on AVX-512 two blocks per step: odd counts take the
    last one alone), scales of either sign and any size, activations at +-127 (each 32's largest) in
    every position and sign pattern, and every bit / code pattern: all-set, all-clear, alternating."""
    ops = kernels.load(isa)
    assert ops is not None
    _, values, size = LOWBIT_TYPES[qtype]
    gen = torch.Generator().manual_seed(2)
    for nblocks in range(1, 7):
        k = values * nblocks
        blocks = random_lowbit_blocks(qtype, 24, k, seed=nblocks, any_scale=nblocks % 2 == 0)
        body = blocks.reshape(24, nblocks, size)[:, :, 2 if qtype != "NVFP4" else 4 :]
        body[0], body[1], body[2] = 0xFF, 0x00, 0x55  # all set / all clear / alternating (Q2_0: 0 / 1 / 3)
        body[3] = 0xAA  # Q2_0: code 2 everywhere
        if qtype == "NVFP4":  # the scale bytes' ends: 0x7F is zero, 0xFF is not (bit 7 ignored otherwise)
            scales = np.array([0, 1, 7, 8, 0x7E, 0x7F, 0x80, 0xFF], dtype=np.uint8)
            blocks.reshape(24, nblocks, size)[4:8, :, :4] = np.resize(scales, (4, nblocks, 4))
        w = torch.from_numpy(dequantize_lowbit(blocks, qtype).reshape(24, k)).double()
        matrix = kernels.BlockMatrix([kernels.Segment(qtype, torch.from_numpy(blocks))], k, ops)
        for rows in (1, 2, 3, 4):
            x = torch.randn(rows, k, generator=gen)
            x[0] = torch.where(torch.rand(k, generator=gen) < 0.5, -1.0, 1.0)  # every code at +-127
            got = ops.matmul(x, matrix)
            assert _within_bound(got, x, w, k), (nblocks, rows)


@needs_kernels
@pytest.mark.skipif("avx512vnni" not in kernels.runnable_isas(), reason="the x16 forms are AVX-512 VNNI's")
@pytest.mark.parametrize("qtype", ["Q1_0", "Q2_0"])
def test_x16_form(qtype: str) -> None:
    """Q1_0 / Q2_0 repacked into 16-row panels (csrc/lc_lowbit_x16.h): rows dequantize to the file's values
    bit for bit (embedding lookups), and the product at 1-6, 16 and 70 activation rows (4 per pass over a
    panel or a pair of panels, a partial pass) stays within the float32 bound, for 37 rows (a partial panel,
    an odd last one), float32 and bfloat16."""
    ops = kernels.load("avx512vnni")
    assert ops is not None
    n = 37
    gen = torch.Generator().manual_seed(3)
    values = LOWBIT_TYPES[qtype][1]
    patterns = np.array([0xFF, 0x00, 0x55, 0xAA], dtype=np.uint8)[:, None, None]  # Q2_0: codes 3, 0, 1, 2
    for k in (values, values * 5):
        blocks = random_lowbit_blocks(qtype, n, k, seed=k, any_scale=True)
        blocks.reshape(n, k // values, 18)[:4, :, 2:] = patterns
        w = torch.from_numpy(dequantize_lowbit(blocks, qtype).reshape(n, k)).double()
        packed = ops.repack(kernels.Segment(qtype, torch.from_numpy(blocks)), k)
        assert packed.packed_rows == n
        ids = torch.tensor([0, 36, 17, 1, 2, 15, 16])
        got = ops.dequantize_rows(packed, k, ids, torch.float32).numpy()
        assert np.array_equal(got.view(np.uint32), w.float().numpy()[ids.numpy()].view(np.uint32))
        matrix = kernels.BlockMatrix([packed], k, ops)
        for rows in (1, 2, 3, 4, 5, 6, 16, 70):
            x = torch.randn(rows, k, generator=gen)
            x[0] = torch.where(torch.rand(k, generator=gen) < 0.5, -1.0, 1.0)
            assert _within_bound(ops.matmul(x, matrix), x, w, k), (k, rows)
            xb = x.bfloat16()
            got_bf16 = ops.matmul(xb, matrix).double()
            xq = quantized_activations(xb.float())
            want = xq @ w.T
            bound = (k / 4 + 8) * 2.0**-24 * (xq.abs() @ w.abs().T) + want.abs() * 2.0**-8 + 1e-6
            assert ((got_bf16 - want).abs() <= bound).all(), (k, rows)


@needs_kernels
def test_block_table_entries() -> None:
    for qtype, (type_id, values, size) in LOWBIT_TYPES.items():
        assert kernels.BLOCKS[qtype] == (type_id, values, size)
        assert qtype not in kernels.X16_TYPES  # in place (AVX-512 repacks Q1_0 / Q2_0)
        assert kernels.supports(qtype, values * 3) and not kernels.supports(qtype, values + 32)


# The tiny model's logits against the dequantized float32 run, max |difference| over 6 steps: measured
# NVFP4 0.0018, Q1_0 0.0009, Q2_0 0.0012 (AVX-512 VNNI, AVX2 and portable alike); the only difference is
# the kernels' rounding of the activations (precise mode at this size).
@needs_kernels
@pytest.mark.parametrize("qtype", TYPES)
def test_tiny_gguf_runs_on_blocks(tmp_path: Path, qtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every matrix (linears, LM head, embedding) stays in the type's blocks and the run follows the
    dequantized one (prefill on the many-row path, then one-row decode steps)."""
    from tests.helpers.tiny_gguf import TINY_VOCAB_SIZE, write_tiny_gguf

    hf = tiny_hf_model("llama", vocab_size=TINY_VOCAB_SIZE, hidden_size=256, intermediate_size=512)
    path = write_tiny_gguf(tmp_path / f"tiny-{qtype}.gguf", hf, qtype=qtype, tokenizer_kind="gpt2")
    runs = compact_and_dequantized(path, monkeypatch)
    mats = tiny_model_matrices(runs[0])
    assert all(isinstance(m, kernels.BlockMatrix) for m in mats)
    assert {s.qtype for m in mats for s in m.segments} == {qtype}
    worst = follow_dequantized(*runs, steps=6)
    assert worst <= LOGIT_BOUND[qtype], worst


LOGIT_BOUND = {"NVFP4": 0.01, "Q1_0": 0.01, "Q2_0": 0.01}


@pytest.mark.parametrize("qtype", TYPES)
def test_encoders_round_trip(qtype: str) -> None:
    """The test encoders give blocks whose values are the nearest the format allows (sanity of the
    tiny model's weights): error against normal weights, as llama.cpp's reference quantizers give."""
    rng = np.random.default_rng(5)
    data = rng.standard_normal((16, 512)).astype(np.float32)
    back = dequantize_lowbit(LOWBIT_QUANTIZERS[qtype](data), qtype).reshape(data.shape)
    rel = float(np.sqrt(((back - data) ** 2).mean() / (data**2).mean()))
    assert rel < {"NVFP4": 0.12, "Q1_0": 0.65, "Q2_0": 0.75}[qtype], rel


@needs_kernels
@pytest.mark.parametrize("qtype", TYPES)
def test_ram_estimate_sizes_the_files_as_stored(
    tmp_path: Path, qtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the kernels the pre-load RAM check counts the matrices at their stored size (no x16 form), not
    expanded to 2 bytes a value; the MLX estimate at MLX's form (weights/mlx_groups.py)."""
    from localchat.models.memory import compact_gguf_types, estimate
    from tests.helpers.tiny_gguf import random_state_dict, tiny_config, write_tiny_gguf

    monkeypatch.delenv(kernels.KERNELS_ENV, raising=False)
    monkeypatch.delenv(kernels.LAYOUT_ENV, raising=False)
    cfg = tiny_config(hidden_size=128, intermediate_size=256)
    weights = random_state_dict(cfg)
    path = write_tiny_gguf(tmp_path / f"tiny-{qtype}.gguf", weights, cfg, qtype=qtype)
    _, values, size = LOWBIT_TYPES[qtype]
    matrix = sum(w.size for w in weights.values() if w.ndim == 2)
    norms = sum(w.size for w in weights.values() if w.ndim == 1)
    assert qtype in compact_gguf_types("bfloat16")
    assert estimate(path, 64, dtype="bfloat16").weights == matrix // values * size + norms * 4


def _llama_quantize() -> Path | None:
    found = os.environ.get("LOCALCHAT_LLAMA_QUANTIZE") or shutil.which("llama-quantize")
    found = found or next(iter(sorted(glob.glob("/tmp/llamacpp/*/build/bin/llama-quantize"))), None)
    return Path(found) if found and Path(found).is_file() else None


@needs_kernels
@pytest.mark.slow  # llama-quantize in a subprocess
@pytest.mark.parametrize("qtype", ["Q1_0", "Q2_0"])  # llama-quantize offers these two (NVFP4: not yet)
def test_llama_quantize_files_load_and_run_on_blocks(
    tmp_path: Path, qtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tiny Llama quantized by llama.cpp's own llama-quantize: every tensor of the type is byte for byte
    what the test encoder writes (the formats agree), and the file runs on the kernels' blocks, following
    its dequantized float32 run."""
    tool = _llama_quantize()
    if tool is None:
        pytest.skip("llama-quantize not found (set LOCALCHAT_LLAMA_QUANTIZE; CI does not build llama.cpp)")
    from gguf import GGUFReader

    from tests.helpers.tiny_gguf import TINY_VOCAB_SIZE, write_tiny_gguf

    hf = tiny_hf_model("llama", vocab_size=TINY_VOCAB_SIZE, hidden_size=256, intermediate_size=512)
    source = write_tiny_gguf(tmp_path / "tiny-f32.gguf", hf, qtype="F32", tokenizer_kind="gpt2")
    target = tmp_path / f"tiny-{qtype}.gguf"
    env = {**os.environ, "LD_LIBRARY_PATH": str(tool.parent)}
    subprocess.run(
        [str(tool), str(source), str(target), qtype], check=True, capture_output=True, env=env, timeout=300
    )
    floats = {t.name: np.asarray(t.data) for t in GGUFReader(source).tensors}
    typed = [t for t in GGUFReader(target).tensors if t.tensor_type.name == qtype]
    assert len(typed) >= 7  # the layer's linears at least
    for tensor in typed:
        values = floats[tensor.name].reshape(-1, floats[tensor.name].shape[-1])
        assert np.array_equal(
            LOWBIT_QUANTIZERS[qtype](values).reshape(-1), np.asarray(tensor.data).reshape(-1)
        )
    runs = compact_and_dequantized(target, monkeypatch)
    layer: Any = runs[0].model.layers[0]
    assert {s.qtype for m in (layer.qkv, layer.o, layer.gate_up, layer.down) for s in m.segments} == {qtype}
    drivers = [PagedDriver(r) for r in runs]
    for driver in drivers:
        driver.add("a", [5, 17, 99, 3, 250, 42, 7, 7, 81, 130, 64])
    for _ in range(4):
        (_, got), (_, want) = (d.step_logits() for d in drivers)
        assert float((got[0].float() - want[0].float()).abs().max()) <= LOGIT_BOUND[qtype]
        for driver in drivers:
            driver.feed("a", int(want[0].argmax()))
