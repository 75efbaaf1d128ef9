"""The one error translator: every exception leaving a route becomes OpenAI's error JSON,
`{"error": {"message", "type", "param", "code"}}`, with the matching HTTP status."""

from __future__ import annotations

import logging
from typing import Any

from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException

from localchat.errors import LocalchatError

log = logging.getLogger(__name__)


_HTTP_TYPES = {
    400: ("invalid_request_error", "invalid_request"),
    401: ("authentication_error", "invalid_api_key"),
    403: ("permission_error", "forbidden"),
    404: ("not_found_error", "not_found"),
    405: ("invalid_request_error", "method_not_allowed"),
    413: ("invalid_request_error", "payload_too_large"),
    415: ("invalid_request_error", "unsupported_media_type"),
    429: ("rate_limit_error", "rate_limited"),
}


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_for(exc: BaseException) -> tuple[int, dict[str, Any], dict[str, str]]:
    """(status, body, headers) for any exception; also used for errors sent inside an SSE stream."""
    if isinstance(exc, LocalchatError):
        headers = {}
        retry_after = getattr(exc, "retry_after_s", None)  # queue full, shutting down, model loading
        if retry_after is not None:
            headers["Retry-After"] = str(retry_after)
        return exc.status, error_body(exc.message, exc.type, exc.param, exc.code), headers
    if isinstance(exc, HTTPException):
        status = exc.status_code
        type_, code = _HTTP_TYPES.get(
            status, ("server_error" if status >= 500 else "invalid_request_error", None)
        )
        message = exc.detail
        if isinstance(exc, ValidationException) and exc.extra:
            message = f"{exc.detail}: {exc.extra}"
        return status, error_body(message, type_, None, code), dict(exc.headers or {})
    log.exception("unhandled error", exc_info=exc)
    return (
        500,
        error_body(f"Internal server error ({type(exc).__name__}).", "server_error", None, "internal_error"),
        {},
    )


def handle_exception(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    status, body, headers = error_for(exc)
    if isinstance(exc, HTTPException) and status == 404 and exc.detail in ("Not Found", ""):
        body["error"]["message"] = f"Unknown route: {request.method} {request.url.path}"
    elif isinstance(exc, HTTPException) and status == 405:
        body["error"]["message"] = f"Method {request.method} is not allowed on {request.url.path}."
    elif isinstance(exc, HTTPException) and status == 413:
        limit = request.app.state.settings.max_body_mib
        body["error"]["message"] = (
            f"The request body is larger than the {limit:g} MiB limit (--max-body-mib)."
        )
    return Response(body, status_code=status, headers=headers, media_type="application/json")


class GenerationFailedError(LocalchatError):
    """The engine stopped a request with an error (model failure, shutdown) after it was accepted."""

    status = 500
    type = "server_error"
    code = "generation_failed"
