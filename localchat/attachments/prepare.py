"""A message's uploaded files -> attachments ready for the store: every file checked before any is kept,
pictures written to the attachments folder, documents' text read and cut to the model's context."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from localchat.attachments.files import AttachmentFiles
from localchat.attachments.kinds import MAX_ATTACHMENTS, AttachmentError, document_kind, image_kind, is_svg
from localchat.attachments.text import chars_per_token, document_budget_tokens, extract_text, fit
from localchat.chats.records import NewAttachment


@dataclass(frozen=True, slots=True)
class Upload:
    name: str
    data: bytes


@dataclass(frozen=True, slots=True)
class AttachmentRules:
    """What the chat's model and the server's settings allow."""

    model_id: str
    takes_images: bool
    max_model_len: int
    max_images: int
    max_image_bytes: int
    count_tokens: Callable[[str], int] | None = None  # the model's tokenizer, to cut documents to fit


def prepare(uploads: Sequence[Upload], files: AttachmentFiles, rules: AttachmentRules) -> list[NewAttachment]:
    """Blocking (file writes, PDF parsing): call off the event loop. AttachmentError names the file."""
    if len(uploads) > MAX_ATTACHMENTS:
        raise AttachmentError(
            f"A message may carry up to {MAX_ATTACHMENTS} files; this one has {len(uploads)}."
        )
    images = [(u, kind) for u in uploads if (kind := image_kind(u.data)) is not None]
    if images and not rules.takes_images:
        raise AttachmentError(
            f"{rules.model_id} does not see images, so {images[0][0].name} cannot be sent to it. Pick a"
            " model marked \u201csees images\u201d in the model picker, or remove the picture."
        )
    if len(images) > rules.max_images:
        raise AttachmentError(
            f"A message may carry up to {rules.max_images} pictures (--max-images-per-request)."
        )
    for upload, _ in images:
        if len(upload.data) > rules.max_image_bytes:
            raise AttachmentError(
                f"{upload.name} is {len(upload.data) / 2**20:.1f} MiB; pictures may be up to"
                f" {rules.max_image_bytes // 2**20} MiB (--max-image-mib)."
            )
    picture = {id(u): kind for u, kind in images}
    documents = [(u, document_kind(u.name, u.data)) for u in uploads if id(u) not in picture]
    budget = document_budget_tokens(rules.max_model_len, len(documents))
    texts: dict[int, tuple[str, bool]] = {}
    for u, document in documents:
        text = extract_text(u.name, document, u.data)
        texts[id(u)] = fit(text, int(budget * chars_per_token(text, rules.count_tokens)))
    kinds = dict(documents)
    out: list[NewAttachment] = []
    for upload in uploads:  # in the order the user attached them
        if (image := picture.get(id(upload))) is not None:
            sha256 = files.save(upload.data, image.ext)
            out.append(NewAttachment("image", upload.name, image.media_type, len(upload.data), sha256=sha256))
        else:
            text, truncated = texts[id(upload)]
            media_type = "application/pdf" if kinds[upload] == "pdf" else "text/plain"
            out.append(
                NewAttachment(
                    "document", upload.name, media_type, len(upload.data), text=text, truncated=truncated
                )
            )
    return out


__all__ = ["AttachmentError", "AttachmentRules", "Upload", "is_svg", "prepare"]
