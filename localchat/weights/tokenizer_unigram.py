"""SentencePiece Unigram (`tokenizer.ggml.model` = "t5", llama.cpp's UGM) rebuilt from a GGUF vocabulary:
the pieces with their log-probability scores, the model's precompiled normalization map, "▁" for spaces."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as BackendTokenizer

if TYPE_CHECKING:
    from localchat.weights.gguf_tokenizer import GGUFVocab


def unigram_backend(vocab: GGUFVocab) -> BackendTokenizer:
    scores = vocab.scores or [0.0] * len(vocab.tokens)
    unk_id = vocab.unk_id if vocab.unk_id is not None else 2  # llama.cpp's default for this type
    backend = BackendTokenizer(
        models.Unigram([(t, float(s)) for t, s in zip(vocab.tokens, scores, strict=True)], unk_id, False)
    )
    steps: list[normalizers.Normalizer] = []
    if vocab.charsmap:
        steps.append(normalizers.Precompiled(vocab.charsmap))
    if vocab.remove_extra_whitespaces is not False:  # SentencePiece's default: collapse runs of spaces
        steps += [normalizers.Strip(), normalizers.Replace(Regex(" {2,}"), " ")]
    if steps:
        backend.normalizer = normalizers.Sequence(steps)
    prepend = "always" if vocab.add_space_prefix is not False else "never"
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=prepend, split=True)
    backend.decoder = decoders.Metaspace(replacement="▁", prepend_scheme=prepend, split=True)
    return backend
