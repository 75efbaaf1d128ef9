"""Tokenizing for encoders with the `tokenizers` library from the folder's `tokenizer.json` (WordPiece
for BERT, Unigram/BPE for XLM-RoBERTa and friends): special tokens added the way the file's post-
processor says, single texts and (query, document) pairs, cut to the model's longest input."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localchat.errors import ModelLoadError


@dataclass(frozen=True, slots=True)
class Encoded:
    """One input as the encoder takes it."""

    ids: list[int]
    type_ids: list[int]

    def __len__(self) -> int:
        return len(self.ids)


class EncoderTokenizer:
    def __init__(self, folder: Path, max_length: int) -> None:
        from tokenizers import Tokenizer

        path = folder / "tokenizer.json"
        if not path.is_file():
            raise ModelLoadError(f"{folder} has no tokenizer.json (needed for embedding models).")
        self._setup(Tokenizer.from_file(str(path)), max_length)

    @classmethod
    def from_backend(cls, tokenizer: Any, max_length: int) -> EncoderTokenizer:
        """A `tokenizers.Tokenizer` built elsewhere (from a GGUF vocabulary: embeddings/gguf_text.py)."""
        self = cls.__new__(cls)
        self._setup(tokenizer, max_length)
        return self

    def _setup(self, tokenizer: Any, max_length: int) -> None:
        self._tok = tokenizer
        self._tok.no_padding()  # the engine pads per batch
        # NOTE: longest_first: for pairs, trim the longer text first (what sentence-transformers does).
        self._tok.enable_truncation(max_length, strategy="longest_first")
        self.max_length = max_length

    def encode(self, text: str, pair: str | None = None, special: bool = True) -> Encoded:
        enc = self._tok.encode(text, pair, add_special_tokens=special)
        return Encoded(list(enc.ids), list(enc.type_ids))

    def encode_ids(self, ids: list[int]) -> Encoded:
        """Token ids a client sent: used as they are (no special tokens added), cut to the limit."""
        ids = ids[: self.max_length]
        return Encoded(ids, [0] * len(ids))
