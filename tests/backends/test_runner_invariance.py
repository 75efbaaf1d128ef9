"""Batch invariance and preemption, for every real runner through one parametrized fixture.

Through the whole engine (scheduler, block manager, prefix cache, batch builder): 16 prompts submitted
together give the greedy tokens each gives alone, also when the KV budget is so small that the
scheduler must preempt (recompute) requests. fp32 on CPU for both runners: greedy choices on the tiny
random models are clear-cut, so batch-shaped rounding differences cannot flip a token.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

import pytest

from localchat.backends import RunnerOptions, create_runner
from localchat.backends.fake import FakeTokenizer
from localchat.engine.config import EngineConfig
from localchat.engine.engine import LLMEngine
from localchat.engine.sampling_params import SamplingParams
from localchat.weights.bundle import ModelBundle
from tests.helpers.fake_engine import drain
from tests.helpers.torch_models import TEST_DEVICE, exact_weights

pytest.importorskip("torch")  # the tiny models come from transformers

RUNNERS = [
    "torch",
    pytest.param(
        "mlx",
        marks=[
            pytest.mark.mlx,
            pytest.mark.skipif(importlib.util.find_spec("mlx") is None, reason="mlx is not installed"),
        ],
    ),
]
EngineFactory = Callable[[ModelBundle, int], LLMEngine]


@pytest.fixture(params=RUNNERS)
def make_engine(request: pytest.FixtureRequest) -> EngineFactory:
    """(bundle, KV MiB) -> an LLMEngine over a fresh fp32 CPU runner of the parametrized backend."""
    name = request.param

    def build(bundle: ModelBundle, kv_cache_mib: int) -> LLMEngine:
        device = TEST_DEVICE if name == "torch" else "cpu"
        # Bit-exact invariance holds on dequantized weights; the kernels' GEMM and GEMV round differently.
        with exact_weights():
            runner = create_runner(name, bundle, RunnerOptions(device=device, dtype="float32", seed=0))
        tokenizer = bundle.tokenizer if bundle.tokenizer is not None else FakeTokenizer()
        config = EngineConfig(kv_cache_mib=kv_cache_mib, max_num_batched_tokens=256, prefill_chunk_size=64)
        return LLMEngine(
            runner,
            tokenizer,  # type: ignore[arg-type]
            config,
            eos_token_ids=bundle.config.eos_token_ids or [2],
            model_max_len=bundle.config.max_position_embeddings,
        )

    return build


def generate(engine: LLMEngine, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    ids = [engine.add_request(p, params) for p in prompts]
    out: dict[str, list[int]] = {i: [] for i in ids}
    text: dict[str, str] = dict.fromkeys(ids, "")
    for o in drain(engine):  # raises on an error finish
        out[o.req_id].extend(o.new_token_ids)
        text[o.req_id] += o.text_delta
    for i in ids:  # the streaming detokenizer's invariant, on every generation here
        assert text[i] == engine.tokenizer.decode(out[i]), i
    return [out[i] for i in ids]


def tiny_bundle() -> ModelBundle:
    from tests.helpers.torch_models import bundle_from_hf, tiny_hf_model

    # 4 layers x 4 KV heads x head_dim 16 in fp32: 2 KiB of KV per token, so 1 MiB holds 512 tokens.
    return bundle_from_hf(tiny_hf_model("llama", num_hidden_layers=4, num_key_value_heads=4))


def tiny_prompts() -> list[list[int]]:
    shared = [7, 100, 42, 9, 250, 31, 64, 8, 19, 77, 3, 201, 56, 140, 12, 99, 5]  # > one block: cache hits
    prompts = []
    for i in range(16):
        own = [(i * 37 + j * 11) % 250 + 3 for j in range(5 + 3 * i)]
        prompts.append(shared + own if i % 3 == 0 else own)
    return prompts


def assert_invariant(
    make_engine: EngineFactory, bundle: ModelBundle, prompts: list[list[int]], max_tokens: int, small_mib: int
) -> None:
    alone_engine = make_engine(bundle, 64)
    alone = [generate(alone_engine, [p], max_tokens)[0] for p in prompts]
    assert all(len(a) == max_tokens for a in alone)
    distinct = len({tuple(p) for p in prompts})
    assert len({tuple(a) for a in alone}) > distinct // 2  # the model really depends on its prompt

    together_engine = make_engine(bundle, 64)
    assert generate(together_engine, prompts, max_tokens) == alone
    assert together_engine.scheduler.num_preemptions == 0

    cramped = make_engine(bundle, small_mib)
    assert generate(cramped, prompts, max_tokens) == alone
    assert cramped.scheduler.num_preemptions > 0


def test_batch_invariance_and_preemption_tiny(make_engine: EngineFactory) -> None:
    assert_invariant(make_engine, tiny_bundle(), tiny_prompts(), max_tokens=24, small_mib=1)


@pytest.mark.slow
def test_batch_invariance_and_preemption_real_model(make_engine: EngineFactory, smollm2_gguf: Path) -> None:
    from benchmarks.workload import CONCURRENT_PROMPTS
    from localchat.weights.chat_template import ChatTemplate
    from localchat.weights.loader import load_model

    bundle = load_model(smollm2_gguf)
    template = ChatTemplate(
        bundle.chat_template, bos_token=bundle.tokenizer.bos_token, eos_token=bundle.tokenizer.eos_token
    )
    prompts = [
        bundle.tokenizer.encode(
            template.render([{"role": "user", "content": text}], add_generation_prompt=True),
            add_special_tokens=False,
        )
        for text in CONCURRENT_PROMPTS
    ]
    # fp32 KV for SmolLM2: 30 layers x 3 KV heads x 64 x 4 B x 2 = 45 KiB per token; 6 MiB = 136 tokens.
    assert_invariant(make_engine, bundle, prompts, max_tokens=16, small_mib=6)
