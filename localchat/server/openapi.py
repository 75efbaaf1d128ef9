"""The OpenAPI document, served as JSON at GET /openapi.json (behind the API key like every route).

Litestar documents the paths, parameters and responses. The POST routes read their raw body and decode
it themselves (so a bad field is an OpenAI-style 400 naming it), so Litestar cannot see their body type:
`api_operation(Struct)` gives such a route an operation that carries the msgspec struct's JSON schema.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import JsonRenderPlugin
from litestar.openapi.spec import (
    OpenAPIMediaType,
    OpenAPIResponse,
    OpenAPIType,
    Operation,
    Parameter,
    RequestBody,
    Schema,
)

OPENAPI_PATH = "/openapi.json"
_REF = "#/$defs/"


def _inline(schema: Any, defs: dict[str, Any]) -> Any:
    """The schema with every `$ref` replaced by its definition. Litestar rebuilds the document's
    components from its own registry, so the body schemas must stand alone (they are not recursive)."""
    if isinstance(schema, dict):
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith(_REF):
            return _inline(defs[ref[len(_REF) :]], defs)
        return {key: _inline(value, defs) for key, value in schema.items()}
    if isinstance(schema, list):
        return [_inline(item, defs) for item in schema]
    return schema


def body_schema(struct: type[msgspec.Struct]) -> dict[str, Any]:
    (ref,), defs = msgspec.json.schema_components([struct], ref_template=_REF + "{name}")
    result: dict[str, Any] = _inline(ref, defs)
    return result


# What every error looks like (localchat/server/errors.py), whatever the status.
ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}


def api_operation(
    body: type[msgspec.Struct] | None = None, *, path_params: dict[str, str] | None = None
) -> type[Operation]:
    """An Operation class (a handler's `operation_class`) that documents what Litestar cannot see: the
    JSON body the handler decodes itself, path parameters as plain strings (a model id may hold
    slashes, but it is no URI), and errors as OpenAI's error object instead of Litestar's."""
    body_schema_: Any = body_schema(body) if body is not None else None  # plain dicts are emitted as is
    error_schema: Any = ERROR_SCHEMA
    params = path_params or {}

    @dataclass
    class ApiOperation(Operation):
        def __post_init__(self) -> None:
            if body_schema_ is not None:
                self.request_body = RequestBody(
                    content={"application/json": OpenAPIMediaType(schema=body_schema_)}, required=True
                )
            for param in self.parameters or []:
                if isinstance(param, Parameter) and param.name in params:
                    param.schema = Schema(type=OpenAPIType.STRING, description=params[param.name])
            kept = {k: v for k, v in (self.responses or {}).items() if not k.startswith(("4", "5"))}
            kept["default"] = OpenAPIResponse(
                description="An error: OpenAI's error object, with the matching 4xx/5xx status.",
                content={"application/json": OpenAPIMediaType(schema=error_schema)},
            )
            self.responses = kept

    return ApiOperation


def openapi_config(version: str) -> OpenAPIConfig:
    return OpenAPIConfig(
        title="localchat",
        version=version,
        description="OpenAI-compatible API of a local LLM server. Unknown request fields are ignored.",
        path=OPENAPI_PATH,  # the document itself, not a folder of renderers (no HTML viewer: no CDN scripts)
        render_plugins=[JsonRenderPlugin(path="/")],
        use_handler_docstrings=True,
    )
