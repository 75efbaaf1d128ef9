"""The grammar engine's view of a model's tokenizer, built once per tokenizer (it costs ~1 s) and cached."""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Any

import llguidance


@dataclass(frozen=True, slots=True)
class GrammarVocabulary:
    tokenizer: llguidance.LLTokenizer
    model_vocab_size: int  # the logits' width: at least the tokenizer's vocabulary


_cache: weakref.WeakKeyDictionary[Any, GrammarVocabulary] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def grammar_tokenizer(tokenizer: Any, model_vocab_size: int) -> GrammarVocabulary:
    """The grammar engine's view of our Tokenizer (a `tokenizers` backend) or the fake byte tokenizer.

    `model_vocab_size` is the logits' width, which may exceed the tokenizer's (padded embeddings): the
    extra ids are never allowed. The model's end-of-turn tokens end every grammar.
    """
    with _lock:
        cached = _cache.get(tokenizer)
        if cached is not None and cached.model_vocab_size == model_vocab_size:
            return cached
        eos = list(tokenizer.eos_token_ids)
        backend = getattr(tokenizer, "backend", None)
        if backend is not None:
            built = llguidance.LLTokenizer(backend.to_str(), n_vocab=model_vocab_size, eos_token=eos)
        else:
            built = llguidance.LLTokenizer(_ByteTokens(tokenizer), n_vocab=model_vocab_size, eos_token=eos)
        vocabulary = GrammarVocabulary(built, max(model_vocab_size, built.vocab_size))
        _cache[tokenizer] = vocabulary
        return vocabulary


class _ByteTokens(llguidance.TokenizerWrapper):
    """Adapts a tokenizer without a `tokenizers` backend (the fake one) through its `token_bytes`."""

    def __init__(self, tokenizer: Any) -> None:
        self.eos_token_id = tokenizer.eos_token_ids[0]
        self.bos_token_id = tokenizer.bos_token_id
        self.tokens = [tokenizer.token_bytes(i) for i in range(tokenizer.vocab_size)]
        self.special_token_ids = sorted(tokenizer.all_special_ids)
        self.is_tokenizer_wrapper = True
        self._tokenizer = tokenizer
        self._accepts_bytes = False

    def __call__(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False))
