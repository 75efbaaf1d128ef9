"""BERT WordPiece (`tokenizer.ggml.model` = "bert") rebuilt from a GGUF vocabulary.

llama.cpp's converter spells the vocabulary its own way: a word-initial piece gets a "▁" in front and a
continuation piece loses its "##". This undoes that, so the `tokenizers` WordPiece model (greedy longest
match, a word with no full match becomes [UNK]) sees BERT's own spelling.
"""

from __future__ import annotations

from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers

_WORD_START = "▁"
_CONTINUATION = "##"
_CONTROL = 3
# llama.cpp puts no length limit on a word (transformers' default turns words over 100 chars into [UNK]).
_MAX_WORD_CHARS = 1_000_000


def wordpiece_backend(
    tokens: list[str],
    token_types: list[int],
    unk_token: str,
    *,
    lowercase: bool = True,
    strip_accents: bool | None = None,
) -> BackendTokenizer:
    vocab: dict[str, int] = {}
    for index, (token, kind) in enumerate(zip(tokens, token_types, strict=True)):
        if kind == _CONTROL:
            spelled = token
        elif token.startswith(_WORD_START) and len(token) > len(_WORD_START):
            spelled = token[len(_WORD_START) :]
        else:
            spelled = _CONTINUATION + token
        vocab[spelled] = index  # a repeated spelling keeps its last id, as in llama.cpp's token_to_id
    backend = BackendTokenizer(
        models.WordPiece(
            vocab=vocab,
            unk_token=unk_token,
            continuing_subword_prefix=_CONTINUATION,
            max_input_chars_per_word=_MAX_WORD_CHARS,
        )
    )
    backend.normalizer = normalizers.BertNormalizer(
        clean_text=True,
        handle_chinese_chars=True,
        strip_accents=lowercase if strip_accents is None else strip_accents,
        lowercase=lowercase,
    )
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece(prefix=_CONTINUATION)
    return backend
