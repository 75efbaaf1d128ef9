"""What the hybrid-model server tests share (tests/e2e/test_hybrid_server*.py, test_hybrid_spec_server.py,
test_mamba_hybrid_server.py): a tiny random hybrid checkpoint saved as a hub folder with a byte-level BPE
tokenizer and a ChatML template, transformers' greedy answers for it, and chat requests sent at once."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import httpx
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedModel

from tests.helpers.tiny_gguf import GPT2_SPECIALS, tiny_gpt2_vocab

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
PROMPTS = ["Hello there, my friend.", "The quick brown fox", "def add(a, b):", "Numbers: 1 2 3 4 5 6 7 8 9"]
MAX_TOKENS = 6


def write_hybrid_folder(folder: Path, hf: PreTrainedModel) -> Tokenizer:
    """Saves `hf` (built over tests.helpers.tiny_gguf.TINY_VOCAB_SIZE) in `folder` with the BPE part of
    the tiny GPT-2 vocabulary (no <think> pair) and the ChatML template, <|im_end|> its EOS; returns
    the tokenizer."""
    tokens, _, merges = tiny_gpt2_vocab()
    vocab = {t: i for i, t in enumerate(tokens[: len(tokens) - 2])}
    pairs = cast(list[tuple[str, str]], [tuple(m.split(" ")) for m in merges])
    tok = Tokenizer(models.BPE(vocab, pairs))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(GPT2_SPECIALS)
    eos = tok.token_to_id("<|im_end|>")
    hf.config.eos_token_id = eos
    hf.generation_config.eos_token_id = eos
    hf.save_pretrained(folder)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": CHATML, "eos_token": "<|im_end|>", "bos_token": None})
    )
    return tok


def expected_tokens(tok: Tokenizer, hf: torch.nn.Module, prompt: str, text: str | None = None) -> list[int]:
    """transformers' greedy MAX_TOKENS for a one-message chat of `prompt` (or for the rendered `text`),
    without the EOS."""
    text = text or f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.encode(text).ids
    generate: Any = hf.generate
    with torch.no_grad():
        out = generate(torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False)
    return [t for t in out[0, len(ids) :].tolist() if t != tok.token_to_id("<|im_end|>")]


def expected_answers(tok: Tokenizer, hf: torch.nn.Module, prompts: list[str]) -> dict[str, str]:
    """Each prompt's greedy answer as text, as the server should return it."""
    return {p: tok.decode(expected_tokens(tok, hf, p), skip_special_tokens=True) for p in prompts}


def assert_greedy_at_once(client: httpx.Client, model: str, expected: dict[str, str]) -> None:
    """Each prompt of `expected` as a one-message greedy chat of MAX_TOKENS, all sent at once: each gets
    a 200 and its expected answer."""

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

    prompts = list(expected)
    with ThreadPoolExecutor(len(prompts)) as pool:
        answers = dict(zip(prompts, pool.map(ask, prompts), strict=True))
    for prompt in prompts:
        assert answers[prompt] == expected[prompt], prompt
