"""A hybrid model (Qwen3.5: gated DeltaNet + full attention) through the real server: a tiny random
checkpoint saved as a safetensors folder, served by `localchat serve` on the torch backend in float32.

Concurrent greedy completions whose prompts outnumber the state slots (max_num_seqs 2 for 4 requests,
small prefill chunks) each return transformers' greedy tokens for that prompt alone; /metrics shows the
state pool. A chat's second turn reuses the first's prefix through a state checkpoint (cached tokens in
its usage) and still answers as transformers does for the whole conversation."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch
from tokenizers import Tokenizer

from tests.backends.test_qwen3_next import tiny_qwen3_5
from tests.helpers.hybrid_server import (
    MAX_TOKENS,
    PROMPTS,
    assert_greedy_at_once,
    expected_answers,
    expected_tokens,
    write_hybrid_folder,
)
from tests.helpers.live_server import live_server
from tests.helpers.tiny_gguf import TINY_VOCAB_SIZE


def _write_folder(folder: Path) -> tuple[Tokenizer, torch.nn.Module]:
    """The tiny random Qwen3.5 as a hub folder (test_hybrid_spec_server.py and the MLX check serve it too)."""
    hf = tiny_qwen3_5(vocab_size=TINY_VOCAB_SIZE)
    return write_hybrid_folder(folder, hf), hf


@pytest.mark.slow
def test_hybrid_model_serves_concurrent_requests_with_state_slots(tmp_path: Path) -> None:
    tok, hf = _write_folder(tmp_path / "qwen3_5-tiny")
    expected = expected_answers(tok, hf, PROMPTS)
    args = ["--w", str(tmp_path / "qwen3_5-tiny"), "--backend", "torch", "--dtype", "float32"]
    args += ["--max-num-seqs", "2", "--prefill-chunk-size", "8", "--mem", "16", "--log", "info"]
    with live_server(args) as server, server.client() as client:
        model = client.get("/v1/models").json()["data"][0]["id"]

        def chat(messages: list[dict[str, str]]) -> dict[str, Any]:
            body = {"model": model, "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0}
            reply = client.post("/v1/chat/completions", json=body)
            assert reply.status_code == 200, reply.text
            return reply.json()

        assert_greedy_at_once(client, model, expected)
        metrics = server.metrics()
        assert metrics["localchat_state_slots_total"] == metrics["localchat_max_num_seqs"] == 2
        assert metrics["localchat_state_slots_used"] == 0
        assert metrics["localchat_state_bytes_per_slot"] > 0
        assert metrics["localchat_prefix_caching_enabled"] == 1  # with state checkpoints
        assert metrics["localchat_state_checkpoints_total"] == 8
        log = server.log()
        assert re.search(r"State cache: 2 slots \(max_num_seqs 2\) \+ 8 prefix checkpoints", log), log[-2000:]

        # A second turn: the first turn's prompt (longer than a block) is a prefix of it.
        first = " ".join(PROMPTS)
        answer = chat([{"role": "user", "content": first}])["choices"][0]["message"]["content"]
        turns = [
            {"role": "user", "content": first},
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "And then?"},
        ]
        second = chat(turns)
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in turns)
        want = expected_tokens(tok, hf, "", text + "<|im_start|>assistant\n")
        assert second["choices"][0]["message"]["content"] == tok.decode(want, skip_special_tokens=True)
        assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= 16
        assert server.metrics()["localchat_state_checkpoint_restores_total"] >= 1
