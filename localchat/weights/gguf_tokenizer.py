"""Rebuild a Hugging Face `tokenizers` tokenizer from the vocabulary a GGUF file carries.

Two vocabulary kinds (`tokenizer.ggml.model`):
- "gpt2": byte-level BPE from tokens + merges; the split regex comes from `tokenizer.ggml.pre`.
- "llama": SentencePiece BPE with byte fallback; merges are rebuilt from the token scores.
Control tokens become special added tokens, user-defined ones plain added tokens, so both stay whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gguf import GGUFReader
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as BackendTokenizer

from localchat.errors import ModelLoadError
from localchat.weights.gguf import gguf_value
from localchat.weights.gguf_pretokenizers import (
    PRE_TOKENIZERS,
    PreTokenizer,
    UnsupportedTokenizerError,
    pre_tokenizer_for,
)
from localchat.weights.tokenizer_unigram import unigram_backend
from localchat.weights.tokenizer_wordpiece import wordpiece_backend

# llama.cpp's token types (tokenizer.ggml.token_type).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


@dataclass(slots=True)
class GGUFVocab:
    """The tokenizer.ggml.* metadata, read once."""

    model: str  # "gpt2" | "llama"
    pre: str | None
    tokens: list[str]
    token_types: list[int]
    scores: list[float] | None
    merges: list[str] | None
    bos_id: int | None
    eos_id: int | None
    unk_id: int | None
    pad_id: int | None
    add_bos: bool | None  # None: the file does not say
    add_eos: bool | None
    add_space_prefix: bool | None
    sep_id: int | None = None
    add_sep: bool | None = None
    lowercase: bool | None = None  # BERT's normalizer options
    strip_accents: bool | None = None
    charsmap: bytes | None = None  # SentencePiece's precompiled normalization map (Unigram)
    remove_extra_whitespaces: bool | None = None

    @classmethod
    def read(cls, reader: GGUFReader) -> GGUFVocab:
        def get(key: str) -> Any:
            return gguf_value(reader, f"tokenizer.ggml.{key}")

        tokens = get("tokens")
        if not tokens:
            raise ModelLoadError("The GGUF file has no tokenizer vocabulary (tokenizer.ggml.tokens).")
        types = [int(t) for t in get("token_type") or [NORMAL] * len(tokens)]
        if len(types) != len(tokens):
            raise ModelLoadError("The GGUF tokenizer has a different number of token types than tokens.")
        return cls(
            model=str(get("model") or ""),
            pre=get("pre"),
            # llama.cpp names empty tokens the same way, so each still has a key of its own.
            tokens=[t or f"[EMPTY_{i}]" for i, t in enumerate(tokens)],
            token_types=types,
            scores=get("scores"),
            merges=get("merges"),
            bos_id=get("bos_token_id"),
            eos_id=get("eos_token_id"),
            unk_id=get("unknown_token_id"),
            pad_id=get("padding_token_id"),
            add_bos=get("add_bos_token"),
            add_eos=get("add_eos_token"),
            add_space_prefix=get("add_space_prefix"),
            sep_id=get("seperator_token_id"),
            add_sep=get("add_sep_token"),
            lowercase=get("normalizer.lowercase"),
            strip_accents=get("normalizer.strip_accents"),
            charsmap=_charsmap(reader),
            remove_extra_whitespaces=get("remove_extra_whitespaces"),
        )

    def tokenizer_settings(self) -> dict[str, Any]:
        """The special-token facts localchat's Tokenizer takes, with llama.cpp's defaults per type."""
        if self.model == "bert":  # [CLS] text [SEP]; the ids llama.cpp assumes when the file names none
            cls_token, sep = self.token(_first(self.bos_id, 101)), self.token(_first(self.sep_id, 102))
            add_sep = self.add_sep is not False
            return {
                "bos_token": cls_token,
                "eos_tokens": [sep] if sep else [],
                "add_bos": self.add_bos is not False,
                "add_eos": add_sep,
            }
        eos = self.token(self.eos_id)
        return {
            "bos_token": self.token(self.bos_id),
            "eos_tokens": [eos] if eos else [],
            "add_bos": self.default_add_bos(),
            "add_eos": bool(self.add_eos) if self.model != "t5" else self.add_eos is not False,
            "space_prefix": self.model == "llama" and self.add_space_prefix is not False,
        }

    def token(self, token_id: int | None) -> str | None:
        return self.tokens[token_id] if token_id is not None and 0 <= token_id < len(self.tokens) else None

    def default_add_bos(self) -> bool:
        """What llama.cpp does for a file without add_bos_token: SentencePiece and Llama 3 vocabularies add BOS."""
        if self.add_bos is not None:
            return bool(self.add_bos)
        if self.model in ("llama", "gemma4"):
            return True
        return self.model == "gpt2" and pre_tokenizer_for(self.pre).add_bos


def _first(value: int | None, default: int) -> int:
    return default if value is None else value


def _charsmap(reader: GGUFReader) -> bytes | None:
    field = reader.fields.get("tokenizer.ggml.precompiled_charsmap")
    if field is None or not field.data:
        return None
    return b"".join(field.parts[i].tobytes() for i in field.data)


def byte_level_alphabet() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table: printable Latin-1 bytes stand for
    themselves, the other 68 are shifted past U+0100 in byte order."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in printable}
    shifted = (b for b in range(256) if b not in table)
    table.update({b: chr(0x100 + i) for i, b in enumerate(shifted)})
    return dict(sorted(table.items()))


def build_backend(vocab: GGUFVocab) -> BackendTokenizer:
    if vocab.model == "gpt2":
        backend = _byte_level_bpe(vocab)
    elif (
        vocab.model == "gemma4"
    ):  # llama.cpp reads it as BPE with the gemma4 pre-tokenizer, whatever `pre` says
        backend = _utf8_bpe(vocab, PRE_TOKENIZERS["gemma4"])
    elif vocab.model == "llama":
        backend = _sentencepiece_bpe(vocab)
    elif vocab.model == "bert":
        unk = vocab.token(_first(vocab.unk_id, 100)) or "[UNK]"
        lowercase = vocab.lowercase is not False
        backend = wordpiece_backend(
            vocab.tokens, vocab.token_types, unk, lowercase=lowercase, strip_accents=vocab.strip_accents
        )
    elif vocab.model == "t5":
        backend = unigram_backend(vocab)
    else:
        raise UnsupportedTokenizerError(
            f"GGUF tokenizer type {vocab.model!r} (tokenizer.ggml.model) is not supported. Supported: "
            "'gpt2' and 'gemma4' (BPE), 'llama' (SentencePiece BPE), 'bert' (WordPiece), 't5' (Unigram). "
            "Use the model's safetensors folder (its tokenizer.json) instead."
        )
    _add_special_tokens(backend, vocab)
    return backend


def _byte_level_bpe(vocab: GGUFVocab) -> BackendTokenizer:
    pre = pre_tokenizer_for(vocab.pre)
    if not pre.byte_level:
        return _utf8_bpe(vocab, pre)
    if vocab.merges is None:
        raise UnsupportedTokenizerError(
            f"The GGUF BPE vocabulary (pre-tokenizer {vocab.pre!r}) has no merges (tokenizer.ggml.merges); "
            "localchat cannot rebuild it. Use the model's safetensors folder (its tokenizer.json)."
        )
    alphabet = set(byte_level_alphabet().values())
    spelling = byte_level_alphabet()
    ids: dict[str, int] = {}
    for index, (token, kind) in enumerate(zip(vocab.tokens, vocab.token_types, strict=True)):
        # Added tokens keep their literal text; a normal token outside the byte alphabet is re-spelled in it.
        if kind not in (CONTROL, USER_DEFINED) and not set(token) <= alphabet:
            token = "".join(spelling[b] for b in token.encode("utf-8"))
        ids[token] = index
    backend = BackendTokenizer(
        models.BPE(
            vocab=ids,
            merges=_split_merges(vocab.merges),
            fuse_unk=False,
            byte_fallback=False,
            ignore_merges=pre.ignore_merges,
        )
    )
    if pre.nfc:
        backend.normalizer = normalizers.NFC()
    splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in pre.splits]
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    backend.decoder = decoders.ByteLevel()
    return backend


def _utf8_bpe(vocab: GGUFVocab, pre: PreTokenizer) -> BackendTokenizer:
    """BPE over raw UTF-8 (Gemma 4: spaces spelt "▁", merges run over whole lines): a character without
    a token falls back to its <0xXX> byte tokens."""
    ids = {token: index for index, token in enumerate(vocab.tokens)}
    backend = BackendTokenizer(
        models.BPE(vocab=ids, merges=_split_merges(vocab.merges or []), fuse_unk=False, byte_fallback=True)
    )
    if pre.escape_spaces:
        backend.normalizer = normalizers.Replace(" ", "▁")
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in pre.splits]
    )
    steps = [decoders.ByteFallback(), decoders.Fuse()]
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), *steps] if pre.escape_spaces else steps)
    return backend


def _split_merges(merges: list[str]) -> list[tuple[str, str]]:
    pairs = [m.split(" ", 1) for m in merges]
    return [(a, b) for a, b in pairs]


def _sentencepiece_bpe(vocab: GGUFVocab) -> BackendTokenizer:
    ids = {token: index for index, token in enumerate(vocab.tokens)}
    if vocab.merges:
        merges = _split_merges(vocab.merges)
    elif vocab.scores is not None:
        merges = _merges_from_scores(vocab.tokens, vocab.scores, vocab.token_types)
    else:
        raise ModelLoadError("The GGUF SentencePiece vocabulary has neither merges nor scores.")
    unk = vocab.token(vocab.unk_id)
    backend = BackendTokenizer(
        models.BPE(vocab=ids, merges=merges, unk_token=unk, fuse_unk=True, byte_fallback=True)
    )
    # Spaces become "▁". The dummy prefix SentencePiece puts before the text is added by Tokenizer.encode:
    # NOTE: Metaspace's own prepend skips text that already starts with a space (" a" -> "▁a"), where
    # SentencePiece and llama.cpp give "▁▁a"; transformers' GGUF conversion inherits that difference.
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=False)
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    prefix = vocab.add_space_prefix is not False
    backend.decoder = decoders.Sequence([*steps, decoders.Strip(" ", 1, 0)] if prefix else steps)
    return backend


def _merges_from_scores(tokens: list[str], scores: list[float], types: list[int]) -> list[tuple[str, str]]:
    """SentencePiece BPE merges the pair whose joined piece scores highest; as ranked merges that is
    every (left, right) split of a normal piece, best piece score first (longer left part on ties)."""
    known = {token for token, kind in zip(tokens, types, strict=True) if kind == NORMAL}
    found: list[tuple[float, int, int, str, str]] = []
    for token, score, kind in zip(tokens, scores, types, strict=True):
        if kind != NORMAL:
            continue  # byte and control pieces are never built from text
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in known and right in known:
                found.append((-float(score), -len(left), -len(right), left, right))
    found.sort(key=lambda m: m[:3])  # stable: equal keys keep vocabulary order
    return [(left, right) for *_, left, right in found]


def _add_special_tokens(backend: BackendTokenizer, vocab: GGUFVocab) -> None:
    named = {vocab.bos_id, vocab.eos_id, vocab.unk_id, vocab.pad_id} - {None}
    special = [
        AddedToken(token, special=True, normalized=False)
        for index, (token, kind) in enumerate(zip(vocab.tokens, vocab.token_types, strict=True))
        if kind == CONTROL or (index in named and kind != BYTE)
    ]
    user = [
        AddedToken(token, special=False, normalized=False)
        for token, kind in zip(vocab.tokens, vocab.token_types, strict=True)
        if kind == USER_DEFINED
    ]
    backend.add_special_tokens(special)
    backend.add_tokens(user)
