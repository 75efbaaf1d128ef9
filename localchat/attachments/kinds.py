"""What an attached file is, from its bytes (and, for text, its name): a picture a vision model can take,
a PDF, a text document, or something the chat cannot use (a clear error, never a silent drop)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePath

MAX_ATTACHMENTS = 8  # per message, pictures and documents together
MAX_DOCUMENT_BYTES = 10 * 1024 * 1024


class AttachmentError(ValueError):
    """A file the chat cannot take; the message says which and why (shown in the UI's notice)."""


@dataclass(frozen=True, slots=True)
class ImageKind:
    media_type: str
    ext: str


# Magic bytes of the picture formats the vision path decodes (PNG, JPEG, GIF, WebP).
_IMAGE_MAGIC: tuple[tuple[bytes, ImageKind], ...] = (
    (b"\x89PNG\r\n\x1a\n", ImageKind("image/png", "png")),
    (b"\xff\xd8\xff", ImageKind("image/jpeg", "jpg")),
    (b"GIF87a", ImageKind("image/gif", "gif")),
    (b"GIF89a", ImageKind("image/gif", "gif")),
)
IMAGE_EXTENSIONS = frozenset({"png", "jpg", "jpeg", "gif", "webp"})


def image_kind(data: bytes) -> ImageKind | None:
    """The picture format of these bytes, or None. Decided by content, never by the name or the
    browser's content type (a renamed file must not be served as something else)."""
    for magic, kind in _IMAGE_MAGIC:
        if data.startswith(magic):
            return kind
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return ImageKind("image/webp", "webp")
    return None


def extension(name: str) -> str:
    return PurePath(name).suffix.lower().lstrip(".")


def is_svg(name: str, data: bytes) -> bool:
    head = data[:512].lstrip().lower()
    return extension(name) == "svg" or head.startswith(b"<svg") or b"<svg" in head[:256]


def document_kind(name: str, data: bytes) -> str:
    """ "pdf" or "text" for a document the chat can read; AttachmentError for anything else."""
    if is_svg(name, data):
        raise AttachmentError(f"{name}: SVG files are not accepted (as a picture or as text).")
    if len(data) > MAX_DOCUMENT_BYTES:
        raise AttachmentError(
            f"{name} is {len(data) / 2**20:.1f} MiB; documents may be up to {MAX_DOCUMENT_BYTES // 2**20} MiB."
        )
    if data.startswith(b"%PDF-"):
        return "pdf"
    if extension(name) in IMAGE_EXTENSIONS:
        raise AttachmentError(f"{name} is not a PNG, JPEG, GIF or WebP picture this chat can read.")
    if b"\x00" not in data[:8192]:
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            pass
        else:
            return "text"
    raise AttachmentError(
        f"{name} is a binary file the chat cannot read. Attach pictures (PNG, JPEG, GIF, WebP), PDFs,"
        " or text files (txt, md, code, csv, json)."
    )
