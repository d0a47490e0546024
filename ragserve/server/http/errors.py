"""The HTTP doors' one error table: an error kind to its status and an error body in OpenAI's
shape (every HTTP door answers in it: the OpenAI SDKs read it, the MCP door's refusals before any
tool runs use it), and the same answer written straight to a socket."""

from __future__ import annotations

import math
from typing import Any

import orjson
from starlette.responses import Response

from ragserve.errors import ErrorKind, InvalidArgument, Overloaded, RagError

STATUS: dict[ErrorKind, tuple[int, str]] = {
    ErrorKind.INVALID_ARGUMENT: (400, "invalid_request_error"),
    ErrorKind.RESOURCE_EXHAUSTED: (429, "rate_limit_error"),
    ErrorKind.DEADLINE_EXCEEDED: (504, "timeout"),
    ErrorKind.UNAVAILABLE: (503, "service_unavailable"),
    ErrorKind.FAILED_PRECONDITION: (400, "invalid_request_error"),  # e.g. generation is off on this server
    ErrorKind.UNAUTHENTICATED: (401, "authentication_error"),
    ErrorKind.PERMISSION_DENIED: (403, "permission_error"),
    ErrorKind.INTERNAL: (500, "server_error"),
}


def json_response(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(body), status, headers, media_type="application/json")


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def http_error(error: RagError) -> tuple[int, dict[str, Any], dict[str, str]]:
    """The HTTP status, the error body and the extra headers (Retry-After) of a domain error."""
    status, kind = STATUS[error.kind]
    headers: dict[str, str] = {"www-authenticate": "Bearer"} if error.kind is ErrorKind.UNAUTHENTICATED else {}
    param = None
    message = str(error)
    if isinstance(error, InvalidArgument):
        param, message = error.field, f"{error.field}: {error.description}"
    if isinstance(error, Overloaded):
        headers["retry-after"] = str(max(1, math.ceil(error.retry_after_ms / 1000)))
        headers["retry-after-ms"] = str(error.retry_after_ms)
    # `code`: the kind in gRPC's words, the same on every door (two kinds may share a status here).
    return status, error_body(message, kind, param, error.kind.value.lower()), headers


def error_response(error: RagError) -> Response:
    status, body, headers = http_error(error)
    return json_response(status, body, headers)


def raw_response(status: int, reason: str, message: str, kind: str) -> bytes:
    """A whole HTTP/1.1 answer with an error body that closes the connection, written straight to
    the socket (before or outside any ASGI call)."""
    body = orjson.dumps(error_body(message, kind))
    head = f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
    return head.encode() + b"connection: close\r\n\r\n" + body
