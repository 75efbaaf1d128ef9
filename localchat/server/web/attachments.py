"""The web UI's attached pictures, served by hash through the gated app (the same key and Origin rules as
every UI route): only a stored picture's bytes, with its own content type, never sniffed by the browser."""

from __future__ import annotations

import re

from litestar import Response, get
from litestar.di import NamedDependency
from litestar.params import FromPath

from localchat.errors import NotFoundError
from localchat.server.web.common import WebState

_NAME = re.compile(r"([0-9a-f]{64})\.(png|jpg|gif|webp)")


@get("/ui/attachments/{name:str}", name="web:attachment", sync_to_thread=True)
def attachment(web: NamedDependency[WebState], name: FromPath[str]) -> Response[bytes]:
    match = _NAME.fullmatch(name)  # a hash and a known extension: no path can reach outside the folder
    if match is None:
        raise NotFoundError("No such attachment.")
    stored = web.store.image_attachment(match.group(1))
    if stored.file_name != name:
        raise NotFoundError("No such attachment.")
    try:
        data = web.store.read_image(stored)
    except OSError:
        raise NotFoundError("This picture's file is missing from the data directory.") from None
    headers = {
        "X-Content-Type-Options": "nosniff",
        "Cache-Control": "private, max-age=31536000, immutable",  # the name is the content's hash
        "Content-Security-Policy": "default-src 'none'; sandbox",
    }
    return Response(data, media_type=stored.media_type, headers=headers)


ROUTES = [attachment]
