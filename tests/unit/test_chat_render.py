"""One render + encode of a conversation (serving/chat_render.py), and every caller gets the same prompt
from it: the API's chat prompt, the vision chat prompt without pictures, ServerContext and `LLM`, all
on the real SmolLM2 template and tokenizer."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from localchat.config import Settings
from localchat.llm import LLM
from localchat.serving.chat_render import chat_tokens, render_chat
from localchat.serving.context import ServerContext
from localchat.serving.prompts import PromptTooLongError, chat_prompt
from localchat.vision.chat_prompt import chat_prompt_with_images
from localchat.weights.bundle import ModelBundle
from localchat.weights.chat_template import ChatTemplate
from localchat.weights.loader import load_model

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
SMOLLM2_PROMPT = (
    "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
)


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf: Path) -> ModelBundle:
    return load_model(smollm2_gguf)


def _context(bundle: ModelBundle, max_model_len: int = 8192) -> ServerContext:
    engine = SimpleNamespace(max_model_len=max_model_len)
    return ServerContext(Settings(), cast(Any, engine), bundle, "smollm2", ChatTemplate(bundle.chat_template))


def test_the_prompt_is_the_template_text_encoded_without_another_bos(smollm2: ModelBundle) -> None:
    template, tokenizer = ChatTemplate(smollm2.chat_template), smollm2.tokenizer
    text, ids = chat_tokens(template, tokenizer, MESSAGES)
    assert text == render_chat(template, tokenizer, MESSAGES) == SMOLLM2_PROMPT
    assert ids == tokenizer.encode(SMOLLM2_PROMPT, add_special_tokens=False)
    assert ids[0] == tokenizer.token_to_id("<|im_start|>") and ids[-1] != tokenizer.bos_token_id


def test_every_caller_gets_the_same_prompt(smollm2: ModelBundle) -> None:
    ctx = _context(smollm2)
    want = chat_tokens(ctx.template, smollm2.tokenizer, MESSAGES)
    llm = object.__new__(LLM)  # only its template and tokenizer: no runner is needed to build a prompt
    llm.template, llm.tokenizer = ctx.template, smollm2.tokenizer
    assert llm.apply_chat_template(MESSAGES) == want[1]
    assert ctx.chat_tokens(MESSAGES) == want and ctx.encode_chat(MESSAGES) == want[1]
    assert asyncio.run(chat_prompt(ctx, MESSAGES)) == want
    assert asyncio.run(chat_prompt_with_images(ctx, MESSAGES)) == (*want, ())


def test_expand_rewrites_the_text_before_it_is_encoded(smollm2: ModelBundle) -> None:
    ctx = _context(smollm2)
    text, ids = ctx.chat_tokens(MESSAGES, expand=lambda t: t.replace("Hi there", "Hello"))
    assert "Hello" in text and ids == smollm2.tokenizer.encode(text, add_special_tokens=False)


def test_a_text_refused_by_its_length_is_never_encoded(
    smollm2: ModelBundle, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = _context(smollm2, max_model_len=1)  # 64 characters at most
    encoded: list[str] = []

    def spy(text: str, **_: Any) -> list[int]:
        encoded.append(text)
        return []

    monkeypatch.setattr(smollm2.tokenizer, "encode", spy)
    with pytest.raises(PromptTooLongError):
        asyncio.run(chat_prompt(ctx, MESSAGES))
    assert encoded == []
