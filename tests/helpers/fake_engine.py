"""Build an engine on the fake backend (no weights) for engine, server and UI tests."""

from __future__ import annotations

from backends.fake import EOS_ID, FakeRunner, FakeTokenizer
from localchat.engine.config import EngineConfig
from localchat.engine.engine import LLMEngine


def fake_engine(kv_bytes_per_token: int = 128, **config: object) -> LLMEngine:
    """A 1 MiB KV budget by default: 8192 tokens at the default 128 bytes per token."""
    cfg = EngineConfig(**{"kv_cache_mib": 1, **config})  # type: ignore[arg-type]
    runner = FakeRunner(kv_bytes_per_token=kv_bytes_per_token)
    return LLMEngine(runner, FakeTokenizer(), cfg, eos_token_ids=[EOS_ID], model_max_len=4096)


def chat_prompt(text: str) -> list[int]:
    return FakeTokenizer().encode(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")
