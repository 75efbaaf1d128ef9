"""The tokenizer of a GGUF embedding model: the file's vocabulary rebuilt as a `tokenizers` backend by
localchat/weights/gguf_tokenizer.py (WordPiece for llama.cpp's `bert` vocabularies), with BERT's
[CLS] text [SEP] (and [CLS] a [SEP] b [SEP], token types 0/1, for pairs; XLM-R's <s> a </s></s> b </s> for its Unigram
vocabulary) added the way the HF tokenizer of the same model adds them."""

from __future__ import annotations

from pathlib import Path

from localchat.embeddings.text import EncoderTokenizer
from localchat.errors import ModelLoadError


def gguf_encoder_tokenizer(path: Path, max_length: int) -> EncoderTokenizer:
    from tokenizers import processors

    from localchat.weights.gguf import gguf_value, open_gguf
    from localchat.weights.gguf_tokenizer import GGUFVocab, build_backend

    reader = open_gguf(path)
    vocab = GGUFVocab.read(reader)
    backend = build_backend(vocab)
    tokens = vocab.tokens
    cls_id = gguf_value(
        reader, "tokenizer.ggml.cls_token_id", gguf_value(reader, "tokenizer.ggml.bos_token_id")
    )
    sep_id = gguf_value(
        reader, "tokenizer.ggml.seperator_token_id", gguf_value(reader, "tokenizer.ggml.eos_token_id")
    )
    if cls_id is None or sep_id is None:
        raise ModelLoadError(f"{path.name} names no [CLS]/[SEP] tokens; it cannot be used as an encoder.")
    cls, sep = (tokens[int(cls_id)], int(cls_id)), (tokens[int(sep_id)], int(sep_id))
    # XLM-R (the `t5` Unigram vocabulary) joins a pair as <s> a </s></s> b </s>, all token type 0
    xlmr = vocab.model == "t5"
    pair = f"{sep[0]}:0 $B:0 {sep[0]}:0" if xlmr else f"$B:1 {sep[0]}:1"
    backend.post_processor = processors.TemplateProcessing(
        single=f"{cls[0]}:0 $A:0 {sep[0]}:0",
        pair=f"{cls[0]}:0 $A:0 {sep[0]}:0 {pair}",
        special_tokens=[cls, sep],
    )
    return EncoderTokenizer.from_backend(backend, max_length)
