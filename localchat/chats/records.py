"""The conversation store's records: a conversation, its messages and their attachments, presets and an
answer's earlier versions, as the store reads and writes them (store.py holds the queries, store_schema.py
the tables)."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

# The file extension of each stored picture format (attachments/<sha256>.<ext>).
IMAGE_EXTENSIONS = {"image/png": "png", "image/jpeg": "jpg", "image/gif": "gif", "image/webp": "webp"}

# Statuses of an assistant message: still being written, finished, stopped by the user, failed.
STREAMING, DONE, STOPPED, ERROR = "streaming", "done", "stopped", "error"


@dataclass(slots=True)
class Conversation:
    id: str
    title: str
    model: str = ""
    system_prompt: str = ""
    temperature: float | None = None  # None: the model's default
    top_p: float | None = None
    max_tokens: int | None = None
    created_at: float = 0.0
    updated_at: float = 0.0


@dataclass(slots=True)
class Message:
    id: int
    conversation_id: str
    role: str
    content: str
    status: str = DONE
    error: str | None = None
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tokens_per_s: float | None = None
    created_at: float = 0.0
    model: str | None = None  # the model that wrote an answer (the picker switches models mid-chat)
    alternatives: int = 0  # earlier versions of this answer kept by Regenerate (answer_alternatives)
    earlier_versions: int = 0  # how many of those were written before this one (its place: "2/3")
    attachments: list[Attachment] = field(default_factory=list)  # files the user attached
    # Speculative decoding (0 without it): draft tokens scored, of which accepted, and the target model's
    # passes that gave tokens (completion_tokens over it: tokens per pass).
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    target_passes: int = 0

    @property
    def spec_acceptance(self) -> float:
        return self.spec_accepted_tokens / self.spec_draft_tokens if self.spec_draft_tokens else 0.0

    @property
    def tokens_per_pass(self) -> float:
        return self.completion_tokens / self.target_passes if self.target_passes else 0.0


@dataclass(slots=True)
class Attachment:
    """A file attached to a message: a picture (bytes in the attachments folder, by hash) or a document
    (the text the model reads)."""

    id: int
    message_id: int
    kind: str  # "image" | "document"
    name: str
    media_type: str
    size: int = 0
    sha256: str | None = None
    text: str | None = None
    truncated: bool = False

    @property
    def file_name(self) -> str:
        """A picture's file in the attachments folder."""
        return f"{self.sha256}.{IMAGE_EXTENSIONS.get(self.media_type, 'bin')}"


@dataclass(slots=True)
class NewAttachment:
    kind: str
    name: str
    media_type: str
    size: int = 0
    sha256: str | None = None  # a picture already saved by AttachmentFiles
    text: str | None = None
    truncated: bool = False


@dataclass(slots=True)
class Preset:
    """A saved system prompt and sampling settings, applied to a chat from its settings dialog."""

    name: str
    system_prompt: str = ""
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    created_at: float = 0.0


@dataclass(slots=True)
class NewMessage:
    """A message to insert (import, or a user turn with its answer placeholder)."""

    role: str
    content: str
    status: str = DONE
    extra: dict[str, Any] = field(default_factory=dict)
    attachments: Sequence[NewAttachment] = ()


@dataclass(slots=True)
class Alternative:
    """An earlier version of an answer, replaced by Regenerate."""

    id: int
    message_id: int
    content: str
    model: str | None = None
    finish_reason: str | None = None
    completion_tokens: int = 0
    tokens_per_s: float | None = None
    created_at: float = 0.0


_Row = TypeVar("_Row", "Conversation", "Message", "Preset", "Alternative", "Attachment")


def from_row(cls: type[_Row], row: sqlite3.Row) -> _Row:
    # Only the columns the dataclass knows: a migration may add a column before the code reads it
    # (and fields that are not columns, e.g. a message's attachments, are filled in afterwards).
    columns = set(row.keys())
    return cls(**{f.name: row[f.name] for f in fields(cls) if f.name in columns})


def title_from(text: str, limit: int = 60) -> str:
    """A conversation title from its first message: the first non-empty line, shortened on a word."""
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    if len(line) <= limit:
        return line or "New chat"
    cut = line[:limit].rsplit(" ", 1)[0] or line[:limit]
    return cut.rstrip() + "…"
