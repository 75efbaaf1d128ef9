"""A document's text for the prompt: read (PDFs with pypdf), cut to a budget with a note, and framed with
its file name so the model can tell the file from the user's words."""

from __future__ import annotations

import io
import logging
from collections.abc import Callable

from localchat.attachments.kinds import AttachmentError

# Characters per token when the tokenizer is not asked (English prose and code average 3-4).
CHARS_PER_TOKEN = 3.0
SAMPLE_CHARS = 8_000  # how much of a document is tokenized to learn its characters per token
TRUNCATION_NOTE = "[… the rest of this file was cut: it does not fit in the model's context]"


def extract_text(name: str, kind: str, data: bytes) -> str:
    """The text of a "text" or "pdf" document. Blocking and CPU-bound (PDFs): call off the event loop."""
    if kind == "text":
        return data.decode("utf-8").replace("\r\n", "\n")
    from pypdf import PdfReader  # imported on use: the server does not load it at start-up
    from pypdf.errors import PyPdfError

    logging.getLogger("pypdf").setLevel(logging.ERROR)  # its warnings about sloppy PDFs are not ours
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            raise AttachmentError(f"{name} is a password-protected PDF; save an unprotected copy first.")
        pages = [page.extract_text() or "" for page in reader.pages]
    except (PyPdfError, ValueError, KeyError, TypeError) as exc:
        raise AttachmentError(f"{name} could not be read as a PDF ({exc}).") from exc
    text = "\n\n".join(p.strip() for p in pages if p.strip())
    if not text:
        raise AttachmentError(f"{name} has no text to read (a scanned PDF needs OCR first).")
    return text


def document_budget_tokens(max_model_len: int, documents: int) -> int:
    """Tokens each of a message's documents may take: together half the model's context, so the
    conversation and the answer still fit."""
    return max(256, max_model_len // 2 // max(documents, 1))


def chars_per_token(text: str, count_tokens: Callable[[str], int] | None) -> float:
    """This text's characters per token, measured on a sample with the model's tokenizer (with a
    margin), so a document is cut near what fits without tokenizing all of it."""
    sample = text[:SAMPLE_CHARS]
    if count_tokens is None or not sample:
        return CHARS_PER_TOKEN
    return 0.9 * len(sample) / max(1, count_tokens(sample))


def fit(text: str, budget_chars: int) -> tuple[str, bool]:
    """(text cut to the budget on a line break where one is near, whether it was cut)."""
    if len(text) <= budget_chars:
        return text, False
    cut = text[:budget_chars]
    line_end = cut.rfind("\n")
    if line_end > budget_chars * 0.8:
        cut = cut[:line_end]
    return cut, True


def context_block(name: str, text: str, truncated: bool) -> str:
    """The document as the model reads it: a fence headed by the file name (a fence longer than any
    run of backticks in the text, so the text cannot close it)."""
    ticks = "`" * max(3, _longest_backticks(text) + 1)
    note = f"\n{TRUNCATION_NOTE}" if truncated else ""
    return f"File: {name}\n{ticks}\n{text}\n{ticks}{note}"


def _longest_backticks(text: str) -> int:
    best = run = 0
    for char in text:
        run = run + 1 if char == "`" else 0
        best = max(best, run)
    return best
