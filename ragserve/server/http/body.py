"""What every HTTP door asks of a request before its call: a JSON body, within
RAGSERVE_HTTP_MAX_BODY_BYTES, all there within RAGSERVE_HTTP_BODY_TIMEOUT_S; the caller's
credential as the first Authorization header carries it (as the gRPC port reads its metadata)."""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope

from ragserve.config import HttpSettings
from ragserve.errors import RagError
from ragserve.server.http.errors import error_body, http_error, json_response


class Refused(Exception):
    """A call turned away before it reaches the front (the caller, the body's type, size and time)."""

    def __init__(
        self, status: int, message: str, kind: str, headers: dict[str, str] | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.response: Response = json_response(status, error_body(message, kind, None, code), headers)

    @classmethod
    def of(cls, error: RagError) -> Refused:
        """A front refusal (the caller's credential) in the one table's shape."""
        status, body, headers = http_error(error)
        return cls(status, str(error), body["error"]["type"], headers, body["error"]["code"])


def first_header(scope: Scope, name: bytes) -> str | None:
    """The first value of a header (a repeated Authorization: the first, on every door)."""
    for key, value in scope.get("headers", ()):
        if key == name:
            return str(value.decode("latin-1"))
    return None


def certificate_names_of(scope: Scope) -> set[str]:
    """The verified client certificate's names, as the listener put them in the request's state."""
    names: set[str] = scope.get("state", {}).get("client_ids", set())
    return names


def require_json(request: Request) -> None:
    media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media != "application/json":
        raise Refused(415, "Content-Type must be application/json", "invalid_request_error")


async def read_body(request: Request, limits: HttpSettings) -> bytes:
    """The body, refused (413) past RAGSERVE_HTTP_MAX_BODY_BYTES before it is all read, and (408,
    the connection closed) when it is not all there within RAGSERVE_HTTP_BODY_TIMEOUT_S. A client
    gone meanwhile raises starlette's ClientDisconnect."""
    timeout_s = limits.body_timeout_s
    try:
        async with asyncio.timeout(timeout_s):
            return await _read(request, limits.max_body_bytes)
    except TimeoutError:
        message = f"the body did not arrive within {timeout_s:g} s (RAGSERVE_HTTP_BODY_TIMEOUT_S)"
        raise Refused(408, message, "invalid_request_error", {"connection": "close"}) from None


async def _read(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length", "")
    too_big = Refused(413, f"the body is over {limit} bytes (RAGSERVE_HTTP_MAX_BODY_BYTES)", "invalid_request_error")
    if declared.isdigit() and int(declared) > limit:
        raise too_big
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > limit:
            raise too_big
    return bytes(body)


def replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that hands an already read body to an app that reads it again, then the server's
    own (whose next message is the client's disconnect: a client gone still cancels the call)."""
    sent = False

    async def again() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again
