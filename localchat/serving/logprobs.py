"""Logprobs in OpenAI's two formats: chat (`{"content": [{token, logprob, bytes, top_logprobs}]}`)
and text completions (`{tokens, token_logprobs, top_logprobs, text_offset}`)."""

from __future__ import annotations

import re
from typing import Any

from localchat.engine.interface import TokenLogprobs

MIN_LOGPROB = -9999.0  # OpenAI's floor; JSON has no -inf
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _byte_level_decoder() -> dict[str, int]:
    """GPT-2 byte-level BPE writes each byte as one printable character; this maps them back."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    mapping = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            mapping[chr(256 + extra)] = b
            extra += 1
    return mapping


_BYTE_DECODER = _byte_level_decoder()


class TokenTexts:
    """Text and bytes of single tokens, cached per model (the vocabulary does not change)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def get(self, token_id: int) -> tuple[str, list[int]]:
        hit = self._cache.get(token_id)
        if hit is None:
            raw = self._bytes(token_id)
            hit = self._cache[token_id] = (raw.decode("utf-8", errors="replace"), list(raw))
        return hit

    def _bytes(self, token_id: int) -> bytes:
        text = self.tokenizer.decode([token_id], skip_special_tokens=False)
        piece = self.tokenizer.id_to_token(token_id) if hasattr(self.tokenizer, "id_to_token") else None
        if piece:
            if match := _BYTE_TOKEN.fullmatch(piece):
                return bytes([int(match.group(1), 16)])
            if "▁" in piece:  # SentencePiece marks a leading space with U+2581
                return piece.replace("▁", " ").encode()
            if "\ufffd" in text and all(ch in _BYTE_DECODER for ch in piece):
                return bytes(_BYTE_DECODER[ch] for ch in piece)
        return text.encode()


def _lp(value: float) -> float:
    return max(float(value), MIN_LOGPROB)


def chat_logprobs(texts: TokenTexts, entries: list[TokenLogprobs], top_n: int) -> list[dict[str, Any]]:
    out = []
    for entry in entries:
        token, raw = texts.get(entry.token_id)
        top = []
        for tid, lp in entry.top[:top_n]:
            t, b = texts.get(tid)
            top.append({"token": t, "logprob": _lp(lp), "bytes": b})
        out.append({"token": token, "logprob": _lp(entry.logprob), "bytes": raw, "top_logprobs": top})
    return out


def completion_logprobs(
    texts: TokenTexts, entries: list[TokenLogprobs], top_n: int, start_offset: int = 0
) -> dict[str, Any]:
    tokens, token_lps, tops, offsets = [], [], [], []
    offset = start_offset
    for entry in entries:
        token, _ = texts.get(entry.token_id)
        tokens.append(token)
        token_lps.append(_lp(entry.logprob))
        tops.append({texts.get(tid)[0]: _lp(lp) for tid, lp in entry.top[:top_n]} if top_n else None)
        offsets.append(offset)
        offset += len(token)
    return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}
