"""A hybrid model (Qwen3.5: gated DeltaNet + full attention) through the real server: a tiny random
checkpoint saved as a safetensors folder, served by `localchat serve` on the torch backend in float32.

Concurrent greedy completions whose prompts outnumber the state slots (max_num_seqs 2 for 4 requests,
small prefill chunks) each return transformers' greedy tokens for that prompt alone; /metrics shows the
state pool. A chat's second turn reuses the first's prefix through a state checkpoint (cached tokens in
its usage) and still answers as transformers does for the whole conversation."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from tests.backends.test_qwen3_next import tiny_qwen3_5
from tests.helpers.live_server import live_server
from tests.helpers.tiny_gguf import GPT2_SPECIALS, TINY_VOCAB_SIZE, tiny_gpt2_vocab

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
PROMPTS = ["Hello there, my friend.", "The quick brown fox", "def add(a, b):", "Numbers: 1 2 3 4 5 6 7 8 9"]
MAX_TOKENS = 6


def _write_folder(folder: Path) -> tuple[Tokenizer, torch.nn.Module]:
    tokens, _, merges = tiny_gpt2_vocab()
    vocab = {t: i for i, t in enumerate(tokens[: len(tokens) - 2])}  # the BPE part (no <think> pair)
    tok = Tokenizer(models.BPE(vocab, [tuple(m.split(" ")) for m in merges]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(GPT2_SPECIALS)
    hf = tiny_qwen3_5(vocab_size=TINY_VOCAB_SIZE)
    eos = tok.token_to_id("<|im_end|>")
    hf.config.eos_token_id = eos
    hf.generation_config.eos_token_id = eos
    hf.save_pretrained(folder)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": CHATML, "eos_token": "<|im_end|>", "bos_token": None})
    )
    return tok, hf


def _expected(tok: Tokenizer, hf: torch.nn.Module, prompt: str, text: str | None = None) -> list[int]:
    text = text or f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.encode(text).ids
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False)  # type: ignore[operator]
    return [t for t in out[0, len(ids) :].tolist() if t != tok.token_to_id("<|im_end|>")]


@pytest.mark.slow
def test_hybrid_model_serves_concurrent_requests_with_state_slots(tmp_path: Path) -> None:
    tok, hf = _write_folder(tmp_path / "qwen3_5-tiny")
    expected = {p: tok.decode(_expected(tok, hf, p), skip_special_tokens=True) for p in PROMPTS}
    args = ["--w", str(tmp_path / "qwen3_5-tiny"), "--backend", "torch", "--dtype", "float32"]
    args += ["--max-num-seqs", "2", "--prefill-chunk-size", "8", "--mem", "16", "--log", "info"]
    with live_server(args) as server, server.client() as client:
        model = client.get("/v1/models").json()["data"][0]["id"]

        def chat(messages: list[dict[str, str]]) -> dict[str, Any]:
            body = {"model": model, "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0}
            reply = client.post("/v1/chat/completions", json=body)
            assert reply.status_code == 200, reply.text
            return reply.json()

        def ask(prompt: str) -> str:
            return chat([{"role": "user", "content": prompt}])["choices"][0]["message"]["content"]

        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            answers = dict(zip(PROMPTS, pool.map(ask, PROMPTS), strict=True))
        for prompt in PROMPTS:
            assert answers[prompt] == expected[prompt], prompt
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
        answer = ask(first)
        turns = [
            {"role": "user", "content": first},
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "And then?"},
        ]
        second = chat(turns)
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in turns)
        want = _expected(tok, hf, "", text + "<|im_start|>assistant\n")
        assert second["choices"][0]["message"]["content"] == tok.decode(want, skip_special_tokens=True)
        assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= 16
        assert server.metrics()["localchat_state_checkpoint_restores_total"] >= 1
