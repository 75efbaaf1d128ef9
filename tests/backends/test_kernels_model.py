"""Whole models on localchat's CPU kernels: tiny GGUF files of every block type the kernels read, and
the real SmolLM2 (Q4_1 linears, Q8_0 tied embedding) against the dequantized float32 reference."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from localchat import cpu_features
from localchat.backends import RunnerOptions
from localchat.backends.torch import quant
from localchat.backends.torch.cpu import kernels
from localchat.backends.torch.runner import TorchRunner
from localchat.weights.bundle import ModelBundle
from localchat.weights.loader import load_model
from tests.helpers.real_model import assert_greedy_tracks, chat_prompts
from tests.helpers.torch_batch import PagedDriver
from tests.helpers.torch_models import tiny_hf_model

pytestmark = pytest.mark.skipif(not kernels.runnable_isas(), reason="kernels not built (no C compiler)")

# fp32 top-2 gap below which the kernels' rounding may pick the other token: teacher-forcing fp32's greedy
# tokens through both runs (3 prompts x 48 steps, dev box), the bf16 + 8-bit-activation run moved the
# top-2 gap by 0.10 (median), 0.39 (p99), 0.68 (max); 8-bit activations alone move each dot product by
# up to sum |w| * d / 2 (test_kernels_matmul.py).
NEAR_TIE = 0.7


def runner(
    bundle: ModelBundle, dtype: str, monkeypatch: pytest.MonkeyPatch, mode: str, isa: str
) -> TorchRunner:
    monkeypatch.setenv(quant.QUANT_ENV, mode)
    monkeypatch.setenv(kernels.KERNELS_ENV, isa)
    return TorchRunner(bundle, RunnerOptions(device="cpu", dtype=dtype))


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize(
    "qtype", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
)
def test_tiny_gguf_runs_on_blocks_and_tracks_the_dequantized_run(
    tmp_path: Path, qtype: str, tied: bool, dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every matrix (linears, LM head, embedding) stays in blocks; prefill (tiled path) and one-row steps
    (decode path) follow the dequantized run in the same dtype (fp32: `int4` mode only, for CPUs without
    native bf16)."""
    from tests.helpers.tiny_gguf import TINY_VOCAB_SIZE, write_tiny_gguf

    hf = tiny_hf_model(
        "llama", vocab_size=TINY_VOCAB_SIZE, tie_word_embeddings=tied, hidden_size=256, intermediate_size=512
    )
    bundle = load_model(write_tiny_gguf(tmp_path / "tiny.gguf", hf, qtype=qtype, tokenizer_kind="gpt2"))
    ours = runner(bundle, dtype, monkeypatch, "int4", "auto")  # int4 mode: blocks only, every type
    reference = runner(bundle, dtype, monkeypatch, "dequant", "auto")
    model, layer = ours.model, ours.model.layers[0]
    blocks = (layer.qkv, layer.o, layer.gate_up, layer.down, model.embed, model.lm_head or model.embed)
    assert all(isinstance(w, kernels.BlockMatrix) for w in blocks)
    assert {s.qtype for w in blocks for s in w.segments} == {qtype}
    # `auto` runs the CPU's best ISA; where it has x16 kernels (AVX2, AVX-512 VNNI, NEON) every block type
    # is repacked into panels of 16 rows (the embedding too), on portable C kept as stored
    isa = ours.model.embed.ops.name
    assert isa == cpu_features.best_isa(kernels.runnable_isas())
    x16 = isa in ("avx2", "avx512vnni", "neon") and kernels.layout_choice() == "auto"
    assert {bool(s.packed_rows) for w in blocks for s in w.segments} == {x16}
    prompt = [5, 17, 99, 3, 250, 42, 7, 7, 81, 130, 64]
    drivers = [PagedDriver(ours), PagedDriver(reference)]
    for driver in drivers:
        driver.add("a", prompt)
    for _ in range(5):
        (_, got), (_, want) = (d.step_logits() for d in drivers)
        assert F.cosine_similarity(got[0].float(), want[0].float(), dim=0) > 0.995
        for driver in drivers:
            driver.feed("a", int(want[0].argmax()))


@pytest.mark.slow
@pytest.mark.parametrize("isa", ["auto", "portable"])
def test_smollm2_greedy_tracks_the_fp32_reference(
    smollm2_gguf: Path, isa: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Token-identical to the dequantized fp32 run until a near-tie: only a token whose fp32 top-2 gap is
    within NEAR_TIE of the reference's best may be picked instead (on the dev box, with prefill padded to
    64: the prompts flip at tokens 19, 1 and 25, fp32 logit gaps 0.16, 0.14 and 0.06)."""
    bundle = load_model(smollm2_gguf)
    prompts = chat_prompts(bundle)
    # An ISA by name runs every layer on the blocks (auto would give Q4_1 layers to torch's int4 kernel).
    named = kernels.runnable_isas()[-1] if isa == "auto" else isa
    ours = runner(bundle, "bfloat16", monkeypatch, "auto", named)
    assert isinstance(ours.model.layers[0].qkv, kernels.BlockMatrix)
    fp32 = runner(bundle, "float32", monkeypatch, "dequant", "off")
    assert_greedy_tracks(ours, fp32, bundle, prompts, NEAR_TIE, "kernels")


def test_policy_picks_the_kernels_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    monkeypatch.delenv(quant.QUANT_ENV, raising=False)
    monkeypatch.setenv(kernels.KERNELS_ENV, "auto")
    policy = quant.pick_policy(cpu, torch.bfloat16, 100, 1000)
    assert policy.kernels is not None
    best = policy.kernels.name
    # every GGUF block type, Q4_0/Q4_1 of small models included, on our kernels (decode_step.py runs their
    # decode steps as one C call); torch's int4 kernel only for --isq q4
    assert not policy.int4
    # block matrices: no copies where the many-row path is a SIMD GEMM (AVX2, AVX-512, NEON), copies elsewhere
    assert policy.block_copies == (policy.kernels.name not in quant.FAST_GEMM_ISAS)
    assert quant.FAST_GEMM_ISAS == ("avx512vnni", "avx2", "neon")
    # --isq q4 matrices run on torch's int4 kernel, so they keep their copies where RAM allows
    assert quant.pick_policy(cpu, torch.bfloat16, 100, 1000, isq="q4").dense_copy
    if "avx2" in kernels.runnable_isas():  # AVX2's x16 GEMM (lc_x16_avx2.h): no copies in auto either
        monkeypatch.setenv(kernels.KERNELS_ENV, "avx2")
        assert not quant.pick_policy(cpu, torch.bfloat16, 100, 1000).block_copies
    monkeypatch.setenv(kernels.KERNELS_ENV, "portable")  # portable C's tiles are slow: copies in auto
    assert quant.pick_policy(cpu, torch.bfloat16, 100, 1000).block_copies
    monkeypatch.setenv(kernels.KERNELS_ENV, "auto")
    monkeypatch.setenv(quant.QUANT_ENV, "copies")  # prefill speed for memory: blocks + bf16 copies
    policy = quant.pick_policy(cpu, torch.bfloat16, 100, 1000)
    assert policy.kernels is not None and policy.block_copies and not policy.int4
    no_room = quant.pick_policy(cpu, torch.bfloat16, 900, 1000)
    assert not no_room.dense_copy and not no_room.block_copies
    monkeypatch.delenv(quant.QUANT_ENV)
    # fp32 compute (CPUs without native bf16): every block matrix on the kernels, never a dense fp32 copy
    policy = quant.pick_policy(cpu, torch.float32, 100, 1000)
    if best in quant.FAST_GEMM_ISAS:
        assert policy.kernels is not None and not policy.int4 and not policy.dense_copy
        assert not policy.block_copies
    else:  # portable C's many-row tiles are slow: the dense path
        assert policy == quant.QuantPolicy()
    monkeypatch.setenv(quant.QUANT_ENV, "dequant")
    assert quant.pick_policy(cpu, torch.float32, 100, 1000) == quant.QuantPolicy()  # the exact path
    monkeypatch.setenv(quant.QUANT_ENV, "int4")  # least memory: blocks only
    policy = quant.pick_policy(cpu, torch.bfloat16, 100, 1000)
    assert policy.kernels is not None and not policy.dense_copy and not policy.block_copies
    policy = quant.pick_policy(cpu, torch.float32, 100, 1000)  # fp32 compute too (CPUs without bf16)
    assert policy.kernels is not None and not policy.int4 and not policy.block_copies
    monkeypatch.setenv(quant.QUANT_ENV, "int4")
    monkeypatch.setenv(kernels.KERNELS_ENV, "off")
    assert quant.pick_policy(cpu, torch.bfloat16, 100, 1000) == quant.QuantPolicy(int4=True)
