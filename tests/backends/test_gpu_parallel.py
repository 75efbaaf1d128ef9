"""Layer splits and tensor parallelism on real GPUs (skipped elsewhere; `benchmarks/gpu_check.sh
gpu-layers`, `pp` and `tp` run them): `--gpu-layers` on one GPU (its CPU stage, the copy to cuda, the
GPU stage's warm-up and KV sizing), and PP=2 / TP=2 over NCCL where the machine has two GPUs."""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any, cast

import pytest
import torch

from localchat.backends import RunnerOptions
from localchat.backends.torch.parallel.device_split import SplitRunner, split_runner
from localchat.backends.torch.parallel.driver import ParallelRunner
from localchat.backends.torch.runner import TorchRunner
from tests.backends.test_pipeline_parallel import chunked_and_preempted, family_bundle, ragged_then_decode
from tests.helpers.torch_models import exact_weights, fp32_runner

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
FP32_CUDA = RunnerOptions(device="cuda", dtype="float32")
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")


def _reference(family: str) -> tuple[list[torch.Tensor], dict[str, list[int]], dict[str, list[int]]]:
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 on both devices, compared within 1e-4
    runner = fp32_runner(family_bundle(family))  # the CPU
    logits, tokens = ragged_then_decode(runner)
    return logits, tokens, chunked_and_preempted(runner)


@pytest.mark.parametrize("family", ["llama", "qwen3_moe"])
def test_gpu_layers_split_on_cuda_matches_the_cpu(family: str) -> None:
    expected_logits, expected_tokens, expected_chunked = _reference(family)
    with exact_weights():
        runner = split_runner(family_bundle(family), replace(FP32_CUDA, gpu_layers=1))
    assert isinstance(runner, SplitRunner)
    first, last = runner.stages
    assert (first.device.type, last.device.type) == ("cpu", "cuda")
    assert last.model.norm.device.type == "cuda" and first.model.embed.device.type == "cpu"
    budget = runner.available_kv_memory()  # the GPU stage's warm-up forward runs alone
    assert budget is not None and budget > 0
    logits, tokens = ragged_then_decode(cast(TorchRunner, runner))
    assert first.kv_caches[0].device.type == "cpu" and last.kv_caches[0].device.type == "cuda"
    assert tokens == expected_tokens
    for ours, ref in zip(logits, expected_logits, strict=True):
        torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)
    assert chunked_and_preempted(cast(TorchRunner, runner)) == expected_chunked


@two_gpus
@pytest.mark.parametrize("flag", ["pipeline_parallel_size", "tensor_parallel_size"])
def test_two_ranks_over_nccl_match_one_device(flag: str) -> None:
    expected_logits, expected_tokens, expected_chunked = _reference("llama")
    options = replace(FP32_CUDA, **{flag: 2})  # type: ignore[arg-type]
    with exact_weights():
        runner = ParallelRunner(
            family_bundle("llama"), options, load=functools.partial(family_bundle, "llama")
        )
    try:
        logits, tokens = ragged_then_decode(cast(TorchRunner, runner))
        assert tokens == expected_tokens
        for ours, ref in zip(logits, expected_logits, strict=True):
            torch.testing.assert_close(ours.cpu(), ref, rtol=1e-4, atol=1e-4)
        assert chunked_and_preempted(cast(TorchRunner, runner)) == expected_chunked
    finally:
        runner.shutdown()


@two_gpus
def test_tensor_parallel_size_2_over_nccl_replays_cuda_graphs_per_rank() -> None:
    """Each rank captures its decode graphs with the NCCL collectives inside and replays them: the
    engine's greedy tokens equal TP=2 without graphs, for 16 ragged prompts (batch buckets 1-16)."""
    from localchat.backends.fake import FakeTokenizer
    from localchat.engine.config import EngineConfig
    from localchat.engine.engine import LLMEngine
    from localchat.engine.sampling_params import SamplingParams
    from tests.backends.test_runner_invariance import tiny_prompts

    def greedy(graphs: bool) -> tuple[list[list[int]], int]:
        options = replace(FP32_CUDA, tensor_parallel_size=2, cuda_graphs=graphs)
        with exact_weights():
            runner = ParallelRunner(
                family_bundle("llama"), options, load=functools.partial(family_bundle, "llama")
            )
        try:
            engine = LLMEngine(
                cast(Any, runner),
                FakeTokenizer(),
                EngineConfig(max_num_seqs=16),
                eos_token_ids=[],
                model_max_len=512,
            )
            params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
            ids = [engine.add_request(p, params) for p in tiny_prompts()]
            out: dict[str, list[int]] = {i: [] for i in ids}
            while engine.has_unfinished:
                for o in engine.step():
                    assert o.error is None, o.error
                    out[o.req_id].extend(o.new_token_ids)
            graphs_run = runner.runner.graphs.steps_run if runner.runner.graphs is not None else 0
            return [out[i] for i in ids], graphs_run
        finally:
            runner.shutdown()

    torch.backends.cuda.matmul.allow_tf32 = False
    eager, none_run = greedy(graphs=False)
    graphed, replays = greedy(graphs=True)
    assert none_run == 0 and replays > 0  # rank 0 replayed captured graphs (the workers the same ones)
    assert graphed == eager


@pytest.mark.parametrize("kind", ["qwen3_5", "nemotron_h"])
def test_gpu_layers_split_of_a_hybrid_on_cuda_matches_the_cpu(kind: str) -> None:
    """A hybrid's CPU stage (state slots in RAM) and CUDA stage (its slots on the GPU, run by the
    Triton recurrent kernels there): the warm-up sizes both pools, tokens as on the CPU."""
    from tests.backends import test_pipeline_hybrid as hybrid

    torch.backends.cuda.matmul.allow_tf32 = False
    bundle = hybrid.hybrid_bundle(kind)
    want_logits, want_tokens, want_chunked = hybrid.expected(bundle)
    layers = bundle.config.num_hidden_layers
    with exact_weights():
        runner = split_runner(bundle, replace(FP32_CUDA, gpu_layers=layers // 2))
    assert isinstance(runner, SplitRunner)
    budget = runner.available_kv_memory()
    assert budget is not None and budget > 0 and runner.state_cache_spec is not None
    logits, tokens = hybrid.ragged_then_decode(cast(TorchRunner, runner))
    assert tokens == want_tokens
    for ours, ref in zip(logits, want_logits, strict=True):
        torch.testing.assert_close(ours, ref, rtol=3e-3, atol=3e-3)  # other kernels: see test_qwen3_next
    assert hybrid.chunked_and_preempted(cast(TorchRunner, runner)) == want_chunked
