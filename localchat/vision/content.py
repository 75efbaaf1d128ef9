"""Where a request's picture comes from -> the image file's bytes. data: URLs are always read; file://
paths and http(s) URLs only when the server's settings allow them (both off by default: a local app
reads no files and makes no outbound requests on a client's say). Every file is capped in size."""

from __future__ import annotations

import base64
import binascii
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FETCH_TIMEOUT_S = 15.0
_MIB = 1024 * 1024


class ImageInputError(ValueError):
    """A client error: the API answers 400 with this message."""


@dataclass(frozen=True, slots=True)
class ImageLimits:
    """What a request may ask of the server for its pictures (the --allow-image-urls,
    --allow-local-image-files, --max-images-per-request and --max-image-mib settings)."""

    allow_urls: bool = False
    allow_local_files: bool = False
    max_images: int = 8
    max_bytes: int = 20 * _MIB

    @classmethod
    def from_settings(cls, settings: Any) -> ImageLimits:
        return cls(
            allow_urls=bool(settings.allow_image_urls),
            allow_local_files=bool(settings.allow_local_image_files),
            max_images=int(settings.max_images_per_request),
            max_bytes=int(settings.max_image_mib) * _MIB,
        )


def data_url_bytes(url: str) -> bytes:
    """`data:image/png;base64,....` -> the file's bytes."""
    head, sep, payload = url.partition(",")
    if not sep or not head.startswith("data:image/") or not head.endswith(";base64"):
        raise ImageInputError("an image data URL must look like data:image/png;base64,...")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ImageInputError(f"bad base64 in the image data URL: {exc}") from exc


def read_image_url(url: str, limits: ImageLimits) -> bytes:
    """The bytes a request's image URL names. Blocking (a file read or a fetch): call off the loop."""
    if url.startswith("data:"):
        data = data_url_bytes(url)
    elif url.startswith(("http://", "https://")):
        if not limits.allow_urls:
            raise ImageInputError(
                "image URLs are off on this server: send the picture as a data: URL "
                "(data:image/png;base64,...), or start the server with --allow-image-urls"
            )
        data = _fetch(url, limits.max_bytes)
    elif url.startswith("file://"):
        if not limits.allow_local_files:
            raise ImageInputError(
                "file:// images are off on this server: send the picture as a data: URL, or start the "
                "server with --allow-local-image-files"
            )
        data = _read_file(Path(urllib.parse.unquote(urllib.parse.urlparse(url).path)), limits.max_bytes)
    else:
        raise ImageInputError(
            "an image URL must be a data: URL (data:image/png;base64,...), http(s):// or file://"
        )
    check_size(len(data), limits)
    return data


def check_size(size: int, limits: ImageLimits) -> None:
    if size > limits.max_bytes:
        raise ImageInputError(
            f"the image is {size / _MIB:.1f} MiB, over this server's limit of {limits.max_bytes // _MIB} MiB "
            "(--max-image-mib)"
        )


def _fetch(url: str, max_bytes: int) -> bytes:
    request = urllib.request.Request(url, headers={"User-Agent": "localchat"})
    try:
        with urllib.request.urlopen(request, timeout=FETCH_TIMEOUT_S) as response:
            return bytes(response.read(max_bytes + 1))  # one byte over tells "too large"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ImageInputError(f"could not fetch the image at {url}: {exc}") from exc


def _read_file(path: Path, max_bytes: int) -> bytes:
    try:
        with path.open("rb") as f:
            return f.read(max_bytes + 1)
    except OSError as exc:
        raise ImageInputError(f"could not read the image file {path}: {exc.strerror or exc}") from exc
