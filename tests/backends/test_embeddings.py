"""Embedding requests through the engine and the torch and MLX runners against transformers' final hidden
states (after the final norm), mean-pooled and L2-normalised, on a tiny random model in fp32: chunked
prefill, a cached prefix and a generation request in the same batch must not change the vector."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from localchat.backends.fake import FakeTokenizer
from localchat.engine.config import EngineConfig
from localchat.engine.engine import LLMEngine
from localchat.engine.request import FinishReason
from localchat.engine.sampling_params import SamplingParams
from tests.helpers.torch_models import bundle_from_hf, fp32_runner, tiny_hf_model

EMBED = SamplingParams(max_tokens=1, temperature=0.0, embedding=True)
PROMPTS = [
    [5, 17, 99, 3, 250, 42, 7, 7, 81, 130, 64, 9, 12],
    [8, 1, 200],
    [5, 17, 99, 3, 250, 42, 7, 7, 81, 1],
]


def reference(hf: torch.nn.Module, tokens: list[int]) -> np.ndarray:
    with torch.no_grad():
        hidden = hf.model(torch.tensor([tokens])).last_hidden_state[0].float()  # [T, hidden], normed
    mean = hidden.mean(dim=0)
    return (mean / mean.norm()).numpy()


@pytest.fixture(scope="module")
def hf() -> torch.nn.Module:
    return tiny_hf_model("llama")


def run(engine: LLMEngine, jobs: list[tuple[list[int], SamplingParams]]) -> dict[str, object]:
    ids = [engine.add_request(p, params) for p, params in jobs]
    done = {}
    while engine.has_unfinished:
        for out in engine.step():
            if out.finished:
                done[out.req_id] = out
    return [done[i] for i in ids]  # type: ignore[return-value]


def torch_runner(hf: torch.nn.Module):  # type: ignore[no-untyped-def]
    return fp32_runner(bundle_from_hf(hf))


def mlx_runner(hf: torch.nn.Module):  # type: ignore[no-untyped-def]
    pytest.importorskip("mlx.core")
    from localchat.backends import RunnerOptions
    from localchat.backends.mlx.runner import MLXRunner

    return MLXRunner(bundle_from_hf(hf), RunnerOptions(device="cpu", dtype="float32", seed=0))


@pytest.mark.parametrize("make_runner", [torch_runner, pytest.param(mlx_runner, marks=pytest.mark.mlx)])
def test_embeddings_match_transformers_through_chunked_batched_steps(
    hf: torch.nn.Module, make_runner
) -> None:  # type: ignore[no-untyped-def]
    runner = make_runner(hf)
    config = EngineConfig(kv_cache_mib=4, block_size=4, prefill_chunk_size=4, max_num_batched_tokens=8)
    engine = LLMEngine(runner, FakeTokenizer(), config, eos_token_ids=[], model_max_len=128)
    # A generation first: its prompt's blocks are then cached, and the third embedding shares them.
    generate = (PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))
    [generated] = run(engine, [generate])
    assert generated.num_output_tokens == 6 and generated.embedding is None  # type: ignore[attr-defined]
    # Embeddings of all three prompts, batched with a second generation.
    outs = run(engine, [*[(p, EMBED) for p in PROMPTS], (PROMPTS[1], generate[1])])
    assert outs[-1].num_output_tokens == 6  # type: ignore[attr-defined]
    for prompt, out in zip(PROMPTS, outs[:-1], strict=True):
        assert out.finish_reason == FinishReason.STOP and out.num_output_tokens == 0  # type: ignore[attr-defined]
        ours = np.asarray(out.embedding)  # type: ignore[attr-defined]
        assert ours.shape == (hf.config.hidden_size,)
        np.testing.assert_allclose(ours, reference(hf, prompt), atol=1e-4)
        assert abs(np.linalg.norm(ours) - 1) < 1e-5
    assert engine.block_manager.num_used_blocks == 0
