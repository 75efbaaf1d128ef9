"""Build an engine on the fake backend (no weights) for engine, server and UI tests, and drive it."""

from __future__ import annotations

from collections.abc import Iterator

from localchat.backends.fake import EOS_ID, FakeRunner, FakeTokenizer
from localchat.engine.config import EngineConfig
from localchat.engine.engine import LLMEngine
from localchat.engine.interface import ModelRunner
from localchat.engine.outputs import RequestOutput
from localchat.engine.request import FinishReason


def fake_engine(kv_bytes_per_token: int = 128, **config: object) -> LLMEngine:
    """A 1 MiB KV budget by default: 8192 tokens at the default 128 bytes per token."""
    return engine_on(FakeRunner(kv_bytes_per_token=kv_bytes_per_token), **config)


def engine_on(runner: ModelRunner, **config: object) -> LLMEngine:
    """An engine over `runner` (a fake, or a test's own) with the fake tokenizer and its EOS: a 1 MiB KV
    budget and a 4096-token `model_max_len` unless `config` says otherwise."""
    model_max_len = config.pop("model_max_len", 4096)
    assert isinstance(model_max_len, int)
    cfg = EngineConfig(**{"kv_cache_mib": 1, **config})  # type: ignore[arg-type]
    return LLMEngine(runner, FakeTokenizer(), cfg, eos_token_ids=[EOS_ID], model_max_len=model_max_len)


def chat_prompt(text: str) -> list[int]:
    return FakeTokenizer().encode(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")


def no_error(out: RequestOutput) -> RequestOutput:
    """Fail the test on an error finish. The engine turns a runner exception (the fake runner's
    KV-corruption check among them) into finish_reason "error"; a helper that only waits for requests
    to finish would let that pass."""
    if out.finish_reason == FinishReason.ERROR:
        raise AssertionError(f"{out.req_id} finished with an error: {out.error}")
    return out


def drain(engine: LLMEngine) -> Iterator[RequestOutput]:
    """Step until every request is done, yielding each output; raises on an error finish."""
    while engine.has_unfinished:
        for out in engine.step():
            yield no_error(out)
