"""Rebuild a Hugging Face `tokenizers` tokenizer from the vocabulary a GGUF file carries.

Two vocabulary kinds (`tokenizer.ggml.model`):
- "gpt2": byte-level BPE from tokens + merges; the split regex comes from `tokenizer.ggml.pre`.
- "llama": SentencePiece BPE with byte fallback; merges are rebuilt from the token scores.
Control tokens become special added tokens, user-defined ones plain added tokens, so both stay whole.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from gguf import GGUFReader
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as BackendTokenizer

from localchat.errors import ModelLoadError
from localchat.weights.gguf import gguf_value

log = logging.getLogger(__name__)

# llama.cpp's token types (tokenizer.ggml.token_type).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# Split regexes, as written in the original models' tokenizer.json files.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_DEEPSEEK_CODER = [r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", r"[一-龥ࠀ-一가-퟿]+", r"\p{N}"]
# DeepSeek LLM / DeepSeek-V2(-Lite): runs of cased letters (Latin, Greek, Cyrillic, ... written as code
# point ranges) with an optional leading space, ASCII and full-width punctuation runs, CJK runs and
# digit runs, each a piece of its own (llama.cpp's split list for the `deepseek-llm` pre-tokenizer).
# Escaped: some of these letters would change under an editor's NFC normalization.
_DEEPSEEK_LLM_LETTERS = (
    "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293"
    "\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386"
    "\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f"
    "\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba"
    "\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a"
    "\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d"
    "\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4"
    "\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3"
    "\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107"
    "\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d"
    "\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184"
    "\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d"
    "\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e"
    "\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a"
    "\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb"
    "\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943"
)
_DEEPSEEK_LLM = [
    r"[\r\n]",
    r"\s?[" + _DEEPSEEK_LLM_LETTERS + "]+",
    "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
    r"\s+$",
    "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
    r"\p{N}+",
]
_DEEPSEEK_V3 = [
    r"\p{N}{1,3}",
    r"[一-龥぀-ゟ゠-ヿ]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
]


@dataclass(frozen=True, slots=True)
class _PreTokenizer:
    splits: list[str]  # applied in order; every piece, matched or not, stays a piece
    ignore_merges: bool = False  # a word that is a whole token is taken as is (Llama 3, Tekken)
    nfc: bool = False  # Qwen2's tokenizer.json normalizes to NFC first


_STARCODER = _PreTokenizer([r"\p{N}", _GPT2])  # each digit on its own, then GPT-2's split
_PRE_TOKENIZERS: dict[str, _PreTokenizer] = {
    **dict.fromkeys(
        ("default", "gpt2", "gpt-2", "phi-2", "mpt", "olmo", "jais", "exaone4"), _PreTokenizer([_GPT2])
    ),
    **dict.fromkeys(
        ("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"), _STARCODER
    ),
    **dict.fromkeys(
        ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"),
        _PreTokenizer([_LLAMA3], ignore_merges=True),
    ),
    **dict.fromkeys(("dbrx", "smaug-bpe"), _PreTokenizer([_LLAMA3])),
    "qwen2": _PreTokenizer([_QWEN2], nfc=True),
    **dict.fromkeys(("deepseek-r1-qwen", "stablelm2", "megrez"), _PreTokenizer([_QWEN2])),
    "tekken": _PreTokenizer([_TEKKEN], ignore_merges=True),
    **dict.fromkeys(("gpt-4o", "llama4"), _PreTokenizer([_GPT4O])),
    "deepseek-llm": _PreTokenizer(_DEEPSEEK_LLM),
    "deepseek-coder": _PreTokenizer(_DEEPSEEK_CODER),
    "deepseek-v3": _PreTokenizer(_DEEPSEEK_V3),
}


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
        )

    def token(self, token_id: int | None) -> str | None:
        return self.tokens[token_id] if token_id is not None and 0 <= token_id < len(self.tokens) else None

    def default_add_bos(self) -> bool:
        """What llama.cpp does for a file without add_bos_token: SentencePiece and Llama 3 vocabularies add BOS."""
        if self.add_bos is not None:
            return bool(self.add_bos)
        return self.model == "llama" or _PRE_TOKENIZERS.get(self.pre or "") is _PRE_TOKENIZERS["llama3"]


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
    elif vocab.model == "llama":
        backend = _sentencepiece_bpe(vocab)
    else:
        raise ModelLoadError(
            f"GGUF tokenizer type {vocab.model!r} is not supported (supported: 'gpt2' byte-level BPE, "
            "'llama' SentencePiece)."
        )
    _add_special_tokens(backend, vocab)
    return backend


def _byte_level_bpe(vocab: GGUFVocab) -> BackendTokenizer:
    alphabet = set(byte_level_alphabet().values())
    spelling = byte_level_alphabet()
    ids: dict[str, int] = {}
    for index, (token, kind) in enumerate(zip(vocab.tokens, vocab.token_types, strict=True)):
        # Added tokens keep their literal text; a normal token outside the byte alphabet is re-spelled in it.
        if kind not in (CONTROL, USER_DEFINED) and not set(token) <= alphabet:
            token = "".join(spelling[b] for b in token.encode("utf-8"))
        ids[token] = index
    merges = _split_merges(vocab.merges or [])
    pre = _PRE_TOKENIZERS.get(vocab.pre or "default")
    if pre is None:
        log.warning("Unknown GGUF pre-tokenizer %r; splitting text like GPT-2.", vocab.pre)
        pre = _PRE_TOKENIZERS["default"]
    backend = BackendTokenizer(
        models.BPE(
            vocab=ids, merges=merges, fuse_unk=False, byte_fallback=False, ignore_merges=pre.ignore_merges
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
