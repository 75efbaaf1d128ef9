"""OpenAI `image_url` content parts -> image bytes. Only data: URLs with base64 are read; http(s) URLs
are refused unless the server allows them (the fetch is the caller's: this module does no network I/O),
and a request may carry at most `max_images` pictures."""

from __future__ import annotations

import base64
import binascii

from localchat.vision.gemma3_preprocess import content_hash


class ImageInputError(ValueError):
    """A client error: the API answers 400 with this message."""


def data_url_bytes(url: str) -> bytes:
    """`data:image/png;base64,....` -> the file's bytes."""
    head, sep, payload = url.partition(",")
    if not sep or not head.startswith("data:image/") or not head.endswith(";base64"):
        raise ImageInputError("image_url must be a data:image/...;base64 URL")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ImageInputError(f"image_url: bad base64 data: {exc}") from exc


def image_parts(
    parts: list[dict[str, object]], *, model: str, takes_images: bool, max_images: int, allow_urls: bool
) -> list[tuple[bytes | str, str]]:
    """The `image_url` parts of one request's messages -> (bytes, or an http(s) URL to fetch; content
    hash, or "" for a URL not yet fetched), in order. ImageInputError for what the request may not do."""
    urls = []
    for part in parts:
        if part.get("type") != "image_url":
            continue
        image_url = part.get("image_url")
        url = image_url.get("url") if isinstance(image_url, dict) else image_url
        if not isinstance(url, str):
            raise ImageInputError("image_url needs a url")
        urls.append(url)
    if not urls:
        return []
    if not takes_images:
        raise ImageInputError(f"model {model} does not take images")
    if len(urls) > max_images:
        raise ImageInputError(f"at most {max_images} images per request (got {len(urls)})")
    out: list[tuple[bytes | str, str]] = []
    for url in urls:
        if url.startswith(("http://", "https://")):
            if not allow_urls:
                raise ImageInputError("image URLs are off; send a data: URL or start with --allow-image-urls")
            out.append((url, ""))
        else:
            data = data_url_bytes(url)
            out.append((data, content_hash(data)))
    return out
