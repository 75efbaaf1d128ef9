"""Q4_K GGUFs of the hybrid families on the torch backend's CPU kernels: the recurrent layers'
projections (gated DeltaNet, Mamba-2, LFM2's short conv; Nemotron-H's relu² up) stay in their blocks, and
the model gives transformers' logits and greedy tokens with the file's rounded weights.

llama.cpp's converter writes no K-quants, so the f32 file it writes (test_hybrid_gguf.py's tiny models,
256 wide so that rows split into Q4_K's 256-value super-blocks) is requantized here with localchat's own
Q4_K / Q8_0 encoders (weights/block_quantize.py, byte-exact against ggml's, test_torch_isq_blocks.py):
metadata and every other tensor copied as they are. Q8_0 for rows that do not split into 256s, as
llama-quantize falls back.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter

from localchat.backends.torch.cpu import kernels
from localchat.backends.torch.cpu.kernels import BlockMatrix
from localchat.backends.torch.quant import PermutedWeight
from localchat.models import memory
from localchat.weights.block_quantize import quantize_q4_k, quantize_q8_0
from tests.backends.test_hybrid_gguf import (
    KERNEL_MEAN_TOL,
    KERNEL_TOL,
    PROMPT,
    VOCAB,
    Converted,
    _as_saved,
    _convert,
    _qwen3_5_sizes,
    _randomized,
    _recurrent_count,
    _recurrent_tensor,
    _rounded_twin,
    _save_with_tokenizer,
    assert_follows_twin,
    compact_runner,
    nemotron_h_hub_config,
    recurrent_projections,
)
from tests.backends.test_qwen3_next import HybridDriver

transformers = pytest.importorskip("transformers")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not kernels.runnable_isas(), reason="localchat's CPU kernels are not built"),
]

WIDE = 256  # hidden size: the in_proj rows are one Q4_K super-block
# Tensor names (after `blk.N.`, before `.weight`) llama-quantize never quantizes (conv kernels, routers),
# the small 1-D ones, and the norms.
KEEP = frozenset({"ssm_conv1d", "shortconv.conv", "ffn_gate_inp", "ssm_a", "ssm_d", "ssm_dt"})
# Q4_K rounds a weight by up to about a 15th of its sub-block's range (plus its 6-bit scales)
Q4_K_BOUND = 6


def tiny_qwen3_5() -> torch.nn.Module:
    """Fewer key than value heads (the converter tiles them) and a value head of 64: `ssm_out` (256
    columns, Q4_K) moves its columns by less than a block at load, so its blocks stay as stored and the
    activations move instead (weights/ordered_blocks.py)."""
    torch.manual_seed(0)
    sizes = {**_qwen3_5_sizes(), "hidden_size": WIDE, "linear_value_head_dim": 64}
    return _randomized(
        transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(**sizes)), ("A_log", "dt_bias")
    )


def tiny_nemotron_h() -> torch.nn.Module:
    from tests.backends.test_nemotron_h import TINY

    torch.manual_seed(0)
    sizes = {
        **TINY,
        "vocab_size": VOCAB,
        "hidden_size": WIDE,
        "intermediate_size": WIDE,
        "mamba_head_dim": 64,
    }
    model = transformers.NemotronHForCausalLM(transformers.NemotronHConfig(**sizes))
    return _randomized(model, keep=("A_log", "dt_bias", "D"))


def tiny_lfm2() -> torch.nn.Module:
    from tests.backends.test_lfm2 import tiny_lfm2 as build

    return build(vocab_size=VOCAB, hidden_size=WIDE)


# name: (tiny model, config.json as the hub has it, converter flags)
FAMILIES: dict[str, tuple[Callable[[], torch.nn.Module], Callable[..., dict[str, Any]], tuple[str, ...]]] = {
    "qwen35": (tiny_qwen3_5, _as_saved, ("--no-mtp",)),
    "nemotron_h": (tiny_nemotron_h, nemotron_h_hub_config, ("--config-json-only",)),
    "lfm2": (tiny_lfm2, _as_saved, ()),
}


def requantize(source: Path, out: Path) -> Path:
    """`source` (f32) with its matrices as Q4_K (rows of whole 256s) or Q8_0; all else as it is."""
    reader = GGUFReader(source)
    arch = str(reader.fields["general.architecture"].contents())
    writer = GGUFWriter(out, arch)
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
    for t in reader.tensors:
        data = np.asarray(t.data)
        cols = int(t.shape[0])
        stem = (t.name.split(".", 2)[-1] if t.name.startswith("blk.") else t.name).removesuffix(".weight")
        if (
            data.ndim == 2
            and t.tensor_type == GGMLQuantizationType.F32
            and not (stem in KEEP or stem.endswith("norm"))
        ):
            qtype = GGMLQuantizationType.Q4_K if cols % 256 == 0 else GGMLQuantizationType.Q8_0
            blocks = (quantize_q4_k if qtype == GGMLQuantizationType.Q4_K else quantize_q8_0)(data)
            writer.add_tensor(t.name, blocks, raw_shape=blocks.shape, raw_dtype=qtype)
        else:
            writer.add_tensor(t.name, data, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


@pytest.fixture(scope="module", params=list(FAMILIES))
def q4_k(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Converted:
    build, hub_config, flags = FAMILIES[request.param]
    hf = build()
    tmp = tmp_path_factory.mktemp(f"{request.param}-q4k")
    folder = _save_with_tokenizer(hf, tmp / "hf")
    config_file = folder / "config.json"
    config_file.write_text(json.dumps(hub_config(json.loads(config_file.read_text()))))
    f32 = _convert(folder, tmp / "f32.gguf", "f32", *flags)
    return Converted(hf, request.param, f32, requantize(f32, tmp / "q4_k.gguf"))  # `.q8`: the quantized file


def _types(path: Path) -> dict[str, str]:
    return {t.name: t.tensor_type.name for t in GGUFReader(path).tensors}


def test_q4_k_recurrent_projections_stay_in_blocks(q4_k: Converted, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each recurrent projection is a block matrix of its file's types (Q4_K where the rows split into
    256s); qwen35's `ssm_out`, whose columns move by 64-wide value heads (a quarter of a Q4_K block),
    keeps its blocks as stored behind the column order (`PermutedWeight`). The runner gives transformers'
    logits with the file's rounded weights and its greedy tokens in a ragged batched decode with a
    preemption."""
    types = _types(q4_k.q8)
    recurrent = {n: k for n, k in types.items() if _recurrent_tensor(q4_k.gguf_arch, n)}
    assert "Q4_K" in recurrent.values()
    runner = compact_runner(q4_k.q8, monkeypatch)
    projections = recurrent_projections(runner.model)
    assert len(projections) == _recurrent_count(runner.model.config)
    for name, matrix in projections.items():
        if q4_k.gguf_arch == "qwen35" and name.endswith(".out"):
            assert isinstance(matrix, PermutedWeight), name  # the activations move, not the blocks
            assert {s.qtype for s in matrix.matrix.segments} == {"Q4_K"}, name
            matrix = matrix.matrix
        assert isinstance(matrix, BlockMatrix), name
    kinds = {s.qtype for m in projections.values() if isinstance(m, BlockMatrix) for s in m.segments}
    assert "Q4_K" in kinds
    _, twin = _rounded_twin(q4_k, q4_k.q8, bound=Q4_K_BOUND)
    assert_follows_twin(runner, twin)


def test_qwen35_ssm_out_blocks_give_the_dense_path(q4_k: Converted, monkeypatch: pytest.MonkeyPatch) -> None:
    """qwen35's `ssm_out` run from its stored blocks (activations reordered) equals the dense path on the
    same file (LOCALCHAT_TORCH_QUANT=dequant, float32: the blocks expanded, columns moved at load), layer
    by layer on random inputs and in the prompt's logits."""
    if q4_k.gguf_arch != "qwen35":
        pytest.skip("only qwen35 tiles the value heads")
    from localchat.backends.torch.quant import linear
    from localchat.weights.loader import load_model
    from tests.helpers.torch_models import fp32_runner

    compact = compact_runner(q4_k.q8, monkeypatch)
    dense = fp32_runner(load_model(q4_k.q8))
    dense.initialize_state_cache(4)
    got, want = recurrent_projections(compact.model), recurrent_projections(dense.model)
    outs = [n for n in got if n.endswith(".out")]
    assert outs and all(isinstance(got[n], PermutedWeight) for n in outs)
    x = torch.randn(5, want[outs[0]].shape[1], generator=torch.Generator().manual_seed(0))
    for name in outs:
        expected = x @ want[name].T
        # the kernels round activations to ~15 bits (precise mode): relative error ~1e-4
        assert (linear(x, got[name]) - expected).abs().max() <= 1e-3 * expected.abs().max(), name
    logits = []
    for runner in (compact, dense):
        driver = HybridDriver(runner)
        driver.add("a", PROMPT)
        logits.append(driver.step_logits(every_token=True)[1].float())
    diff = (logits[0] - logits[1]).abs()
    assert diff.max().item() < KERNEL_TOL and diff.mean().item() < KERNEL_MEAN_TOL


def test_estimate_counts_what_the_load_keeps_in_blocks(q4_k: Converted) -> None:
    """The RAM estimate sizes the recurrent projections as their blocks (qwen35's `ssm_out` too, kept as
    stored behind its column order), as the loader holds them."""
    expected = 0
    for t in GGUFReader(q4_k.q8).tensors:
        kind = t.tensor_type.name
        if kind in ("Q4_K", "Q8_0"):
            rows, cols = int(t.shape[1]), int(t.shape[0])
            expected += memory.loaded_block_bytes(kind, rows, cols, int(t.n_bytes))
        else:
            expected += int(t.n_bytes)
    assert memory._loaded_gguf_bytes(q4_k.q8, frozenset({"Q4_K", "Q8_0"}), 0, None, 2) == expected


@pytest.mark.parametrize("family", list(FAMILIES))
def test_isq_quantizes_the_recurrent_projections(family: str) -> None:
    """`--isq q4_k` on a safetensors hybrid: the recurrent projections become Q4_K blocks (rows of whole
    256s; Q5_0 otherwise) like the attention and MLP matrices, and the model still follows the float one
    (a random tiny model amplifies 4-bit rounding: test_torch_isq_blocks.py)."""
    from localchat.backends import RunnerOptions
    from localchat.backends.torch.runner import TorchRunner
    from tests.helpers.torch_models import bundle_from_hf, fp32_runner

    hf = FAMILIES[family][0]()
    runner = TorchRunner(bundle_from_hf(hf), RunnerOptions(device="cpu", dtype="float32", isq="q4_k"))
    projections = recurrent_projections(runner.model)
    assert len(projections) == _recurrent_count(runner.model.config)
    for name, matrix in projections.items():
        assert isinstance(matrix, BlockMatrix), name
        assert {s.qtype for s in matrix.segments} <= {"Q4_K", "Q5_0"}, name
    assert any(s.qtype == "Q4_K" for m in projections.values() for s in m.segments)
    reference = fp32_runner(bundle_from_hf(hf))
    rows = []
    for r in (runner, reference):
        r.initialize_state_cache(4)
        driver = HybridDriver(r)
        driver.add("a", PROMPT)
        rows.append(driver.step_logits(every_token=True)[1].cpu().float())
    assert float(torch.nn.functional.cosine_similarity(rows[0], rows[1], dim=-1).mean()) > 0.8
