"""The tokenizer the engine and server use: a `tokenizers.Tokenizer` plus the model's special-token facts.

Built from a Hugging Face folder (tokenizer.json + tokenizer_config.json) or from a GGUF vocabulary.
BOS/EOS are added here, not by the backend's post-processor, so both sources behave the same way.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenizers import AddedToken
from tokenizers import Tokenizer as BackendTokenizer

from localchat.errors import ModelLoadError

if TYPE_CHECKING:
    from gguf import GGUFReader

# Texts longer than this are encoded without holding the GIL (see Tokenizer.encode).
_LONG_TEXT = 16_384
# transformers' clean_up_tokenization_spaces: drop the space before punctuation and English contractions.
_CLEANUPS = (
    (" .", "."),
    (" ?", "?"),
    (" !", "!"),
    (" ,", ","),
    (" ' ", "'"),
    (" n't", "n't"),
    (" 'm", "'m"),
    (" 's", "'s"),
    (" 've", "'ve"),
    (" 're", "'re"),
)


class Tokenizer:
    def __init__(
        self,
        backend: BackendTokenizer,
        *,
        bos_token: str | None,
        eos_tokens: list[str],
        add_bos: bool,
        add_eos: bool = False,
        clean_up_spaces: bool = False,
        space_prefix: bool = False,
    ) -> None:
        self.backend = backend
        self.bos_token = bos_token
        self.bos_token_id = None if bos_token is None else backend.token_to_id(bos_token)
        eos_ids = [backend.token_to_id(t) for t in eos_tokens]
        self.eos_token_ids: list[int] = list(dict.fromkeys(i for i in eos_ids if i is not None))
        self.eos_token = eos_tokens[0] if eos_tokens else None
        self.add_bos = add_bos and self.bos_token_id is not None
        self.add_eos = add_eos and bool(self.eos_token_ids)
        self.clean_up_spaces = clean_up_spaces
        # SentencePiece's dummy prefix: a space before text that does not open with an added token.
        self.space_prefix = space_prefix
        self._added = tuple(t.content for t in backend.get_added_tokens_decoder().values())

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def all_special_ids(self) -> set[int]:
        special = {i for i, tok in self.backend.get_added_tokens_decoder().items() if tok.special}
        named = {self.bos_token_id, *self.eos_token_ids} - {None}
        return special | named  # type: ignore[operator]

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if self.space_prefix and text and not text.startswith(self._added):
            text = " " + text
        if len(text) > _LONG_TEXT:
            # encode_batch lets go of the GIL while Rust works (encode holds it throughout): a long prompt
            # tokenized on a worker thread must not stall the server's event loop for a second or more.
            ids = self.backend.encode_batch([text], add_special_tokens=False)[0].ids
        else:
            ids = self.backend.encode(text, add_special_tokens=False).ids
        if add_special_tokens:
            if self.add_bos and self.bos_token_id is not None:
                ids.insert(0, self.bos_token_id)
            if self.add_eos:
                ids.append(self.eos_token_ids[0])
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        text = self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
        if self.clean_up_spaces:
            for before, after in _CLEANUPS:
                text = text.replace(before, after)
        return text

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def add_eos_token(self, token: str) -> bool:
        """Also stop on `token` (e.g. a chat template's end-of-turn marker). False if it is not in the vocab."""
        token_id = self.backend.token_to_id(token)
        if token_id is None:
            return False
        if token_id not in self.eos_token_ids:
            self.eos_token_ids.append(token_id)
        return True

    @classmethod
    def from_hf_folder(cls, path: str | Path) -> Tokenizer:
        folder = Path(path)
        if not (folder / "tokenizer.json").is_file():
            raise ModelLoadError(
                f"{folder} has no tokenizer.json. localchat needs the fast-tokenizer file; re-save the model "
                "with a recent transformers (tokenizer.save_pretrained) or use a GGUF file."
            )
        try:
            backend = BackendTokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception as exc:  # tokenizers raises a bare Exception on malformed files
            raise ModelLoadError(f"Cannot read {folder / 'tokenizer.json'}: {exc}") from exc
        config = _read_json(folder / "tokenizer_config.json")
        _add_declared_tokens(backend, config)
        bos, eos = _token_text(config.get("bos_token")), _token_text(config.get("eos_token"))
        if "add_bos_token" in config or "add_eos_token" in config:
            # transformers rebuilds the post-processor from these flags when the config states them.
            add_bos, add_eos = bool(config.get("add_bos_token")), bool(config.get("add_eos_token"))
        else:
            add_bos, add_eos = _post_processor_adds(backend, bos, eos)
        return cls(
            backend,
            bos_token=bos,
            eos_tokens=[eos] if eos else [],
            add_bos=add_bos,
            add_eos=add_eos,
            clean_up_spaces=bool(config.get("clean_up_tokenization_spaces", False)),
        )

    @classmethod
    def from_gguf(cls, reader: GGUFReader) -> Tokenizer:
        from localchat.weights.gguf_tokenizer import GGUFVocab, build_backend

        vocab = GGUFVocab.read(reader)
        return cls(build_backend(vocab), **vocab.tokenizer_settings())


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"Cannot read {path}: {exc}") from exc


def _token_text(value: Any) -> str | None:
    """tokenizer_config.json writes a token as a string or as {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _add_declared_tokens(backend: BackendTokenizer, config: dict[str, Any]) -> None:
    """Tokens tokenizer_config.json declares but tokenizer.json lacks (rare, but transformers adds them)."""
    known = backend.get_vocab(with_added_tokens=True)
    missing = []
    for entry in (config.get("added_tokens_decoder") or {}).values():
        content = entry.get("content")
        if content and content not in known:
            missing.append(
                AddedToken(
                    content,
                    special=bool(entry.get("special")),
                    normalized=bool(entry.get("normalized", not entry.get("special"))),
                    lstrip=bool(entry.get("lstrip")),
                    rstrip=bool(entry.get("rstrip")),
                    single_word=bool(entry.get("single_word")),
                )
            )
    backend.add_special_tokens([t for t in missing if t.special])
    backend.add_tokens([t for t in missing if not t.special])


def _post_processor_adds(backend: BackendTokenizer, bos: str | None, eos: str | None) -> tuple[bool, bool]:
    """Whether tokenizer.json's own post-processor wraps a sequence in BOS / EOS."""
    plain = backend.encode("a", add_special_tokens=False).ids
    full = backend.encode("a", add_special_tokens=True).ids
    bos_id = None if bos is None else backend.token_to_id(bos)
    eos_id = None if eos is None else backend.token_to_id(eos)
    extra = len(full) > len(plain)
    return (
        extra and bos_id is not None and full[0] == bos_id,
        extra and eos_id is not None and full[-1] == eos_id,
    )
