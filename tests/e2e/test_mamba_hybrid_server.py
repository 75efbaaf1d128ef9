"""Granite 4.0-H (Mamba-2 + attention + MoE) through the real server: a tiny random checkpoint folder served
by `localchat serve` on the torch backend in float32, more concurrent greedy requests than state slots
(with small prefill chunks), each answered with transformers' greedy tokens for that prompt alone."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from tests.backends.test_granitemoehybrid import tiny_granite
from tests.e2e.test_hybrid_server import CHATML, MAX_TOKENS, PROMPTS, _expected
from tests.helpers.live_server import live_server
from tests.helpers.tiny_gguf import GPT2_SPECIALS, TINY_VOCAB_SIZE, tiny_gpt2_vocab


@pytest.mark.slow
def test_granite_hybrid_serves_concurrent_requests_with_state_slots(tmp_path: Path) -> None:
    folder = tmp_path / "granite-4.0-h-tiny-random"
    tokens, _, merges = tiny_gpt2_vocab()
    vocab = {t: i for i, t in enumerate(tokens[: len(tokens) - 2])}
    tok = Tokenizer(models.BPE(vocab, [tuple(m.split(" ")) for m in merges]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(GPT2_SPECIALS)
    hf = tiny_granite(vocab_size=TINY_VOCAB_SIZE)
    eos = tok.token_to_id("<|im_end|>")
    hf.config.eos_token_id = eos
    hf.generation_config.eos_token_id = eos
    hf.save_pretrained(folder)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": CHATML, "eos_token": "<|im_end|>", "bos_token": None})
    )
    expected = {p: tok.decode(_expected(tok, hf, p), skip_special_tokens=True) for p in PROMPTS}
    args = ["--w", str(folder), "--backend", "torch", "--dtype", "float32"]
    args += ["--max-num-seqs", "2", "--prefill-chunk-size", "8", "--mem", "16"]
    with live_server(args) as server, server.client() as client:
        model = client.get("/v1/models").json()["data"][0]["id"]

        def ask(prompt: str) -> str:
            body = {
                "model": model,
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": MAX_TOKENS,
                "temperature": 0,
            }
            reply = client.post("/v1/chat/completions", json=body)
            assert reply.status_code == 200, reply.text
            return str(reply.json()["choices"][0]["message"]["content"])

        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            answers = dict(zip(PROMPTS, pool.map(ask, PROMPTS), strict=True))
        for prompt in PROMPTS:
            assert answers[prompt] == expected[prompt], prompt
        metrics = server.metrics()
        assert metrics["localchat_state_slots_total"] == 2
        assert metrics["localchat_state_bytes_per_slot"] == 2 * (3 * 192 * 4 + 4 * 32 * 16 * 4)
