"""MXFP4 (gpt-oss's experts) on localchat's CPU kernels (csrc/lc_mxfp4.h through lc_iquants.h).

- Dequantizing equals the `gguf` package's reference bit for bit, over every exponent byte (0 and 1 give
  subnormal scales, 255 overflows to inf in both).
- Matmul on every ISA this host runs (AVX-512 VNNI, AVX2, portable C) stays within the float32
  accumulation bound of the float64 product of the dequantized weights and the kernels' own 8-bit
  activations (as test_kernels_iquants.py). NEON runs the portable path: tests/c/iq_check.c covers
  MXFP4 under qemu-aarch64 (test_kernels_iquants.py::test_aarch64_build...).
- A tiny gpt-oss from a hub-style folder (MXFP4 experts) keeps its experts in MXFP4 blocks on the kernels
  and gives the greedy tokens of the dequantized run, at 17 bytes per 32 weights.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from localchat.backends.torch.cpu import kernels
from localchat.backends.torch.runner import TorchRunner
from tests.helpers.kernel_checks import check_matmul_bound, compact_and_dequantized
from tests.helpers.torch_batch import PagedDriver

pytestmark = pytest.mark.skipif(not kernels.runnable_isas(), reason="kernels not built (no C compiler)")


def mxfp4_blocks(rows: int, cols: int, seed: int, exponents: tuple[int, int] = (118, 126)) -> np.ndarray:
    """[rows, cols / 32 * 17] GGML MXFP4 blocks: random codes, exponent bytes in `exponents` (inclusive)."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(rows, cols // 32, 17), dtype=np.uint8)
    blocks[..., 0] = rng.integers(exponents[0], exponents[1] + 1, size=(rows, cols // 32), dtype=np.uint8)
    return blocks.reshape(rows, -1)


def reference(blocks: np.ndarray, cols: int) -> np.ndarray:
    return np.asarray(dequantize(blocks, GGMLQuantizationType.MXFP4), dtype=np.float32).reshape(-1, cols)


def test_block_table_entry() -> None:
    assert kernels.BLOCKS["MXFP4"] == (39, 32, 17)
    assert "MXFP4" not in kernels.X16_TYPES  # read in place, like the i-quants


def test_dequantize_equals_gguf_bit_for_bit() -> None:
    ops = kernels.load("portable")
    assert ops is not None
    cols = 256
    blocks = mxfp4_blocks(8, cols, seed=3, exponents=(0, 255))
    blocks[0, ::17][:8] = [0, 1, 2, 126, 127, 128, 254, 255]  # the ends of the e8m0 range, in row 0
    seg = kernels.Segment("MXFP4", torch.from_numpy(blocks))
    ids = torch.arange(8).flip(0)
    with np.errstate(over="ignore"):
        want = reference(blocks, cols)[ids.numpy()]
    got = ops.dequantize_rows(seg, cols, ids, torch.float32).numpy()
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert np.isinf(want).any() and (np.abs(want[want != 0]) < 2.0**-126).any()  # both ends were reached


@pytest.mark.parametrize("isa", kernels.runnable_isas())
def test_matmul_matches_the_dequantized_product(isa: str) -> None:
    """Decode (1-4 rows) and prefill shapes (a partial 4-row group, more than one 64-row chunk), an odd
    number of blocks per row, float32 and bfloat16 activations and outputs."""
    ops = kernels.load(isa)
    assert ops is not None
    n, k = 37, 32 * 23
    blocks = mxfp4_blocks(n, k, seed=7)
    w = torch.from_numpy(reference(blocks, k)).double()
    check_matmul_bound(ops, "MXFP4", blocks, w, rows=(1, 3, 4, 70))


def hub_folder(folder: Path) -> torch.nn.Module:
    """A tiny gpt-oss saved as the hub ships it (MXFP4 experts, the rest float); returns transformers'
    model holding the same experts dequantized. 64 wide, so a row is two MXFP4 blocks."""
    from safetensors.torch import save_file

    from tests.backends.test_gpt_oss import tiny_gpt_oss
    from tests.backends.test_gpt_oss_gguf import mxfp4_model
    from tests.helpers.parity import tiny_tokenizer_json

    hf = tiny_gpt_oss()
    state = mxfp4_model(hf)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"), {"format": "pt"}
    )
    hf_config: Any = hf.config
    config = hf_config.to_dict() | {"quantization_config": {"quant_method": "mxfp4"}}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tokenizer.json").write_text(tiny_tokenizer_json())
    return hf


def expert_matrices(runner: TorchRunner) -> list[Any]:
    layers: Any = runner.model.layers
    return [m for layer in layers for e in layer.moe.experts for m in (e.gate_up, e.down)]


def expert_bytes(runner: TorchRunner) -> int:
    """Bytes the expert matrices hold: their blocks, or their dense tensors."""
    total = 0
    for m in expert_matrices(runner):
        total += m.nbytes if isinstance(m, kernels.BlockMatrix) else m.numel() * m.element_size()
    return total


def assert_tracks(compact: TorchRunner, exact: TorchRunner, prompt: list[int], steps: int = 10) -> None:
    """Same greedy tokens (the dequantized run picks them), logits close at every step."""
    drivers = [PagedDriver(compact), PagedDriver(exact)]
    for driver in drivers:
        driver.add("a", prompt)
    for _ in range(steps):
        (_, got), (_, want) = (d.step_logits() for d in drivers)
        assert F.cosine_similarity(got[0].float(), want[0].float(), dim=0) > 0.999
        assert int(got[0].argmax()) == int(want[0].argmax())
        for driver in drivers:
            driver.feed("a", int(want[0].argmax()))


def test_hub_mxfp4_experts_stay_compact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hub_folder(tmp_path)
    compact, exact = compact_and_dequantized(tmp_path, monkeypatch)
    mats = expert_matrices(compact)
    assert all(isinstance(m, kernels.BlockMatrix) for m in mats)
    assert {s.qtype for m in mats for s in m.segments} == {"MXFP4"}
    assert all(isinstance(m, torch.Tensor) for m in expert_matrices(exact))
    # 17 bytes per 32 weights against float32's 128 (bfloat16's 64)
    assert expert_bytes(compact) * 128 == expert_bytes(exact) * 17
    assert_tracks(compact, exact, [5, 17, 99, 3, 250, 42, 7, 7, 81, 130, 64] * 2)
