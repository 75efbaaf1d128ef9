"""GGUF Q4_0 / Q4_1 linears through torch's int4 weight-only CPU kernel (localchat/backends/torch/quant.py): the
pure-torch path, used when localchat's own kernels are missing, so every test here turns them off
(test_kernels_*.py cover them).

Blocks are random bytes (every nibble occurs) with random float16 scales of both signs. Two references:

- what the kernel should represent: `(q - 8) * bf16(d) + bf16(zero)` per group (zero = 0 for Q4_0,
  m + 8d for Q4_1). The kernel sums in float32 and rounds once to bfloat16, so its output must be the
  float64 dot product rounded to bf16: within bf16's unit roundoff (2^-8 relative) everywhere, and
  equal to it for nearly all outputs (float32 summation can flip a rounding boundary). This pins the
  scale/zero convention: a wrong offset, sign or layout is off by ~100%.
- the exact GGUF values (the `gguf` package's dequantizer): additionally off by the scales' rounding
  to bfloat16, at most 2^-8 of each group's (8 |d| + |zero|): the documented cost of the kernel.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from localchat.backends import RunnerOptions
from localchat.backends.torch import quant
from localchat.backends.torch.quant import Int4Parts, Int4Weight, QuantPolicy, convert, finalize, fuse, linear
from localchat.backends.torch.runner import TorchRunner
from localchat.errors import BackendUnavailableError
from localchat.weights.loader import load_model
from localchat.weights.tensors import WeightTensor
from tests.helpers.torch_batch import PagedDriver
from tests.helpers.torch_models import tiny_hf_model

pytestmark = pytest.mark.skipif(not quant.int4_kernel_available(), reason="torch lacks the int4 CPU kernel")

CPU = torch.device("cpu")
INT4 = QuantPolicy(int4=True)


@pytest.fixture(autouse=True)
def _pure_torch_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCALCHAT_KERNELS", "off")


BF16_ROUNDOFF = 2.0**-8  # bfloat16 keeps 8 significant bits: rounding moves a value by <= 2^-8 of it


def random_blocks(qtype: str, rows: int, cols: int, seed: int = 0) -> WeightTensor:
    rng = np.random.default_rng(seed)
    groups = cols // 32
    d = (rng.uniform(0.002, 0.05, (rows, groups)) * rng.choice([-1, 1], (rows, groups))).astype(np.float16)
    parts = [d.view(np.uint8).reshape(rows, groups, 2)]
    if qtype == "Q4_1":
        m = rng.uniform(-0.5, 0.2, (rows, groups)).astype(np.float16)
        parts.append(m.view(np.uint8).reshape(rows, groups, 2))
    parts.append(rng.integers(0, 256, (rows, groups, 16), dtype=np.uint8))
    data = np.concatenate(parts, axis=-1).reshape(rows, -1)
    return WeightTensor("model.layers.0.mlp.down_proj.weight", (rows, cols), qtype, data)


def block_fields(weight: WeightTensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float64 (d [out, groups], zero = m + 8d or 0 [out, groups], codes [out, groups, 32])."""
    rows, cols = weight.shape
    block = 18 if weight.dtype == "Q4_0" else 20
    raw = weight.data.reshape(rows, cols // 32, block)
    d = raw[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float64)
    m = raw[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64) if block == 20 else None
    nib = raw[..., block - 16 :]  # value j: low nibble of byte j; value j + 16: its high nibble
    codes = np.concatenate((nib & 15, nib >> 4), axis=-1).astype(np.float64)
    return d, (0 * d if m is None else m + 8 * d), codes


def kernel_reference(weight: WeightTensor) -> np.ndarray:
    """float64 [out, in]: the GGUF codes with bf16-rounded scale and zero, as the kernel should see them."""
    d, zero, codes = block_fields(weight)

    def bf16(a: np.ndarray) -> np.ndarray:
        return torch.from_numpy(a).to(torch.bfloat16).double().numpy()

    return ((codes - 8) * bf16(d)[..., None] + bf16(zero)[..., None]).reshape(weight.shape)


def int4_weight(weight: WeightTensor, policy: QuantPolicy = INT4) -> Int4Weight:
    out = finalize(convert(weight, torch.bfloat16, CPU, policy), torch.bfloat16, CPU, policy)
    assert isinstance(out, Int4Weight)
    return out


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1"])
@pytest.mark.parametrize("rows", [1, 3, 5])
def test_int4_linear_matches_the_blocks(qtype: str, rows: int) -> None:
    weight = random_blocks(qtype, 96, 256)
    x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    y = linear(x, int4_weight(weight)).double().numpy()
    xd = x.double().numpy()

    w_kernel = kernel_reference(weight)
    y_kernel = xd @ w_kernel.T
    assert (np.abs(y - y_kernel) <= BF16_ROUNDOFF * np.abs(y_kernel)).all()
    rounded = torch.from_numpy(y_kernel).to(torch.bfloat16).double().numpy()
    assert (y == rounded).mean() >= 0.99

    w_exact = weight.dequantize().astype(np.float64)
    y_exact = xd @ w_exact.T
    assert np.abs(w_kernel - w_exact).max() > 0  # the scales really are rounded...
    d, zero, _ = block_fields(weight)
    # ...by bf16's roundoff each: |(q - 8) (bf16(d) - d)| + |bf16(zero) - zero| per weight
    bound = np.repeat(BF16_ROUNDOFF * (8 * np.abs(d) + np.abs(zero)), 32, axis=1)  # [out, in]
    scale_err = np.abs(xd) @ bound.T
    assert (np.abs(y - y_exact) <= BF16_ROUNDOFF * np.abs(y_exact) + scale_err).all()


def test_q8_0_split_into_two_int4_matrices() -> None:
    """One row: the sum of two int4 products whose weights add up to bf16(d) * q; each product and
    their sum round to bf16 (3 roundings). More rows: the dense table, bit for bit."""
    rng = np.random.default_rng(3)
    rows, cols = 64, 128
    d = (rng.uniform(0.001, 0.02, (rows, cols // 32)) * rng.choice([-1, 1], (rows, cols // 32))).astype(
        np.float16
    )
    q = rng.integers(-128, 128, (rows, cols // 32, 32), dtype=np.int8)  # every value, -128 included
    data = np.concatenate((d.view(np.uint8).reshape(rows, -1, 2), q.view(np.uint8)), axis=-1).reshape(
        rows, -1
    )
    weight = WeightTensor("lm_head.weight", (rows, cols), "Q8_0", data)
    dense = quant.to_tensor(weight, torch.bfloat16, CPU)
    split = quant.split_q8(weight, dense, torch.bfloat16)
    assert split is not None and split.shape == (rows, cols)

    x = torch.randn(1, cols, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    xd = x.double().numpy()
    scale = torch.from_numpy(d.astype(np.float64)).to(torch.bfloat16).double().numpy()  # [rows, groups]
    w = (scale[..., None] * q).reshape(rows, cols)
    u = q.astype(np.int64) + 128
    w_high = (scale[..., None] * (16 * (u >> 4) - 120)).reshape(rows, cols)  # 16d (hi - 8) + 8d
    y_high, y = xd @ w_high.T, xd @ w.T
    bound = BF16_ROUNDOFF * (np.abs(y_high) + np.abs(y - y_high) + np.abs(y)) * 1.01
    assert (np.abs(linear(x, split).double().numpy() - y) <= bound).all()
    assert np.abs(w - weight.dequantize()).max() > 0  # d really is rounded to bf16

    x2 = torch.randn(2, cols).to(torch.bfloat16)
    assert torch.equal(linear(x2, split), F.linear(x2, dense))


def test_many_row_steps_use_the_dense_copy_bit_for_bit() -> None:
    weight = random_blocks("Q4_1", 64, 128)
    packed = int4_weight(weight, QuantPolicy(int4=True, dense_copy=True))
    dense = quant.to_tensor(weight, torch.bfloat16, CPU)  # the dequantize path, unchanged
    assert packed.dense is not None and torch.equal(packed.dense, dense)
    x = torch.randn(quant.DENSE_FROM_ROWS, 128).to(torch.bfloat16)
    assert torch.equal(linear(x, packed), F.linear(x, dense))
    assert not torch.equal(linear(x[:1], packed), F.linear(x[:1], dense))  # one row: the int4 kernel


def test_fused_parts_pack_like_one_matrix_and_mixed_parts_fall_back_to_dense() -> None:
    q, k = random_blocks("Q4_0", 64, 64, seed=1), random_blocks("Q4_1", 32, 64, seed=2)
    fused = fuse([convert(q, torch.bfloat16, CPU, INT4), convert(k, torch.bfloat16, CPU, INT4)])
    assert isinstance(fused, Int4Parts) and fused.shape == (96, 64)
    packed = finalize(fused, torch.bfloat16, CPU, INT4)
    x = torch.randn(2, 64).to(torch.bfloat16)
    expected = torch.cat((linear(x, int4_weight(q)), linear(x, int4_weight(k))), dim=1)
    assert torch.equal(linear(x, packed), expected)

    v = WeightTensor("v", (32, 64), "F32", np.ones((32, 64), dtype=np.float32))
    mixed = fuse([convert(q, torch.bfloat16, CPU, INT4), convert(v, torch.bfloat16, CPU, INT4)])
    assert isinstance(mixed, torch.Tensor)
    assert torch.equal(mixed[:64], quant.to_tensor(q, torch.bfloat16, CPU)) and bool((mixed[64:] == 1).all())


def test_packing_and_dequantizing_in_slices_match_one_go(monkeypatch: pytest.MonkeyPatch) -> None:
    codes = torch.randint(0, 16, (336, 64), dtype=torch.uint8)  # 2 slices of 128 rows + 80 (a partial tile)
    whole = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1)
    weight = random_blocks("Q4_1", 336, 64)
    monkeypatch.setattr(quant, "PACK_ROWS", 128)
    assert torch.equal(quant._pack(336, 64, lambda start, end: codes[start:end]), whole)
    dense = quant.to_tensor(weight, torch.float32, CPU)
    assert torch.equal(dense, torch.from_numpy(weight.dequantize()))


def test_policy_follows_env_device_and_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(quant.QUANT_ENV, raising=False)
    assert quant.pick_policy(CPU, torch.bfloat16, 100, 1000) == QuantPolicy(int4=True, dense_copy=True)
    assert quant.pick_policy(CPU, torch.bfloat16, 900, 1000) == QuantPolicy(int4=True)  # no room for copies
    assert quant.pick_policy(CPU, torch.float32, 100, 1000) == QuantPolicy()  # the exact reference path
    assert quant.pick_policy(torch.device("meta"), torch.bfloat16, 100, 1000) == QuantPolicy()
    monkeypatch.setenv(quant.QUANT_ENV, "int4")
    assert quant.pick_policy(CPU, torch.bfloat16, 100, 1000) == QuantPolicy(int4=True)
    monkeypatch.setenv(quant.QUANT_ENV, "dequant")
    assert quant.pick_policy(CPU, torch.bfloat16, 100, 1000) == QuantPolicy()
    monkeypatch.setenv(quant.QUANT_ENV, "int3")
    with pytest.raises(BackendUnavailableError, match="auto, int4, dequant"):
        quant.pick_policy(CPU, torch.bfloat16, 100, 1000)


@pytest.mark.parametrize(
    ("qtype", "tied"), [("Q4_0", False), ("Q4_1", False), ("Q4_1", True), ("Q8_0", True)]
)
def test_tiny_gguf_runs_packed_and_tracks_the_dequantized_run(
    tmp_path: Path, qtype: str, tied: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bf16 runners on the same GGUF: packed linears and LM head (the embedding table stays dense, and
    serves a tied head's many-row steps) vs everything dequantized."""
    from tests.helpers.tiny_gguf import TINY_VOCAB_SIZE, write_tiny_gguf

    hf = tiny_hf_model("llama", vocab_size=TINY_VOCAB_SIZE, tie_word_embeddings=tied)
    bundle = load_model(write_tiny_gguf(tmp_path / "tiny.gguf", hf, qtype=qtype, tokenizer_kind="gpt2"))
    runners = {}
    for mode in ("auto", "dequant"):
        monkeypatch.setenv(quant.QUANT_ENV, mode)
        runners[mode] = TorchRunner(bundle, RunnerOptions(device="cpu", dtype="bfloat16"))
    model = runners["auto"].model
    layer = model.layers[0]
    linears = (layer.qkv, layer.o, layer.gate_up, layer.down)
    assert all(isinstance(w, Int4Weight if qtype != "Q8_0" else torch.Tensor) for w in linears)
    assert isinstance(model.lm_head, quant.SplitQ8Weight if qtype == "Q8_0" else Int4Weight)
    assert isinstance(model.embed, torch.Tensor) and (model.lm_head.dense is model.embed) == tied
    reference = runners["dequant"].model
    assert isinstance(reference.layers[0].qkv, torch.Tensor)
    assert reference.lm_head is None if tied else isinstance(reference.lm_head, torch.Tensor)
    prompt = [5, 17, 99, 3, 250, 42, 7, 7, 81, 130, 64]
    drivers = {mode: PagedDriver(r) for mode, r in runners.items()}
    for driver in drivers.values():
        driver.add("a", prompt)
    for _ in range(6):  # a prefill step (dense copies) then one-row steps (int4 kernel)
        (_, packed), (_, dense) = (d.step_logits() for d in drivers.values())
        assert F.cosine_similarity(packed[0], dense[0], dim=0) > 0.999
        for driver in drivers.values():
            driver.feed("a", int(dense[0].argmax()))
