"""On a CUDA GPU (skipped elsewhere; benchmarks/gpu_check.sh runs them with the parity suite on CUDA):
the Triton kernels against the CPU path, CUDA graphs on and off token-identical on the real model, the
4-bit CUDA weights against their dequantized values, and KV sizing after the warm-up forward."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from localchat.backends import RunnerOptions, create_runner
from localchat.backends.torch.attention import AttentionMetadata, AttentionOptions, paged_attention
from localchat.backends.torch.cuda.gpu_attention_meta import TritonAttentionMetadata
from localchat.engine.config import EngineConfig
from localchat.engine.engine import LLMEngine
from tests.helpers.paged_batches import make_batch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
CUDA = torch.device("cuda")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "options",
    [None, AttentionOptions(window=512, softcap=50.0, scale=0.07), AttentionOptions(window=37)],
    ids=["plain", "gemma-like", "window"],
)
def test_triton_kernels_match_the_cpu_path(dtype: torch.dtype, options: AttentionOptions | None) -> None:
    from localchat.backends.torch.cuda.triton_attention import triton_paged_attention

    rows = [(700, 1), (37, 1), (300, 120), (9, 9), (2000, 1)]  # long decode rows exercise split-K
    batch = make_batch(rows, block_size=16, num_blocks=220)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(batch.num_tokens, 32, 128, generator=gen)
    k = torch.randn(batch.num_tokens, 8, 128, generator=gen)
    v = torch.randn(batch.num_tokens, 8, 128, generator=gen)
    cache = torch.randn(2, 8, 220 * 16, 128, generator=gen)
    cpu_meta = AttentionMetadata.from_batch(batch, q.device, 8)
    expected = paged_attention(q, k, v, cache.clone(), cpu_meta, options)
    meta = TritonAttentionMetadata.from_batch(batch, CUDA, 8, num_sms=132)
    gpu = [t.to(CUDA, dtype) for t in (q, k, v, cache)]
    got = triton_paged_attention(*gpu, meta, options).float().cpu()
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got, expected, atol=tol, rtol=tol)


def _engine(gguf: Path, graphs: bool) -> LLMEngine:
    from localchat.weights.loader import load_model

    bundle = load_model(gguf)
    runner = create_runner("torch", bundle, RunnerOptions(device="cuda", cuda_graphs=graphs))
    return LLMEngine(
        runner,
        bundle.tokenizer,
        EngineConfig(kv_cache_mib=512, max_num_seqs=16),
        eos_token_ids=bundle.config.eos_token_ids,
        model_max_len=bundle.config.max_position_embeddings,
    )


def test_cuda_graphs_on_and_off_give_identical_greedy_tokens(smollm2_gguf: Path) -> None:
    from benchmarks.workload import CONCURRENT_PROMPTS
    from tests.backends.test_runner_invariance import generate

    eager = _engine(smollm2_gguf, graphs=False)
    prompts = [eager.tokenizer.encode(p) for p in CONCURRENT_PROMPTS]  # type: ignore[attr-defined]
    expected = generate(eager, prompts, max_tokens=32)
    graphed = _engine(smollm2_gguf, graphs=True)
    assert generate(graphed, prompts, max_tokens=32) == expected
    assert graphed.runner.graphs is not None and graphed.runner.graphs.steps_run > 0  # type: ignore[attr-defined]


@pytest.mark.parametrize("rows", [0, 5, 300])
@pytest.mark.parametrize("kernel", ["both", "triton", "tinygemm"])
@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1"])
def test_int4_cuda_linear_matches_dequantized_blocks(qtype: str, kernel: str, rows: int) -> None:
    """Each 4-bit CUDA form (and both kept, routed by rows), a decode-sized and a prefill-sized step, and
    an empty one (a prefill chunk that samples nothing: tinygemm refused it, 'invalid argument', on an H200)."""
    from localchat.backends.torch.cuda.quant_cuda import Int4CudaWeight
    from localchat.backends.torch.cuda.triton_int4_weight import TritonInt4Weight
    from localchat.backends.torch.quant import QuantPolicy, convert, finalize, linear
    from tests.backends.test_torch_quant import random_blocks

    weight = random_blocks(qtype, rows=256, cols=512)
    policy = QuantPolicy(int4=True, cuda=True, cuda_kernel=kernel)
    packed = finalize(convert(weight, torch.bfloat16, CUDA, policy), torch.bfloat16, CUDA, policy)
    assert isinstance(packed, TritonInt4Weight if kernel == "triton" else Int4CudaWeight)
    assert kernel != "both" or packed.many_rows is not None  # type: ignore[union-attr]
    dense = torch.from_numpy(weight.dequantize()).reshape(256, 512).to(CUDA)
    x = torch.randn(rows, 512, device=CUDA).bfloat16()
    expected = x.float() @ dense.t()
    got = linear(x, packed).float()
    assert got.shape == (rows, 256)
    if rows:  # bf16 scales (2^-8 of each group's magnitude) and a bf16 output rounding
        torch.testing.assert_close(got, expected, atol=0.05 * float(expected.abs().max()), rtol=0.02)


def test_kv_sizing_after_warmup_fits_the_device(smollm2_gguf: Path) -> None:
    from localchat.weights.loader import load_model

    runner = create_runner("torch", load_model(smollm2_gguf), RunnerOptions(device="cuda"))
    free, total = torch.cuda.mem_get_info()
    budget = runner.available_kv_memory()
    assert budget is not None and 0 < budget < free <= total


def test_parity_suite_passes_on_cuda() -> None:
    """The whole transformers-parity suite (every architecture, every step shape) with the runner on
    CUDA: the reference stays on the CPU in fp32, ours runs on the GPU (tests/helpers/torch_models.py)."""
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/backends/test_parity.py",
            "-m",
            "not mlx",
        ],
        cwd=repo,
        env={**os.environ, "LOCALCHAT_TEST_DEVICE": "cuda"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:]
    assert " passed" in result.stdout and " failed" not in result.stdout
