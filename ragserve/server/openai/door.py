"""The OpenAI-compatible HTTP door: POST /v1/chat/completions (server-sent events or one JSON body)
and GET /v1/models, on Starlette served by uvicorn on the gRPC server's event loop. The same
pipeline, call gate (admission by class and caller, the call's clock), access grants, bearer token
and TLS files as the gRPC port; conversion lives in server/openai_wire.py.

A client gone (the connection closed) cancels the call: the pipeline's stream is closed, which
aborts the engine request, as a cancelled gRPC call does.

What a browser can be made to send is refused before any of it: a Host header that names no host
this door answers to (421: DNS rebinding), and a POST whose Content-Type is not application/json
(415: a cross-site form or text/plain POST needs no CORS preflight). Beside a private Unix socket
the door does not open without a token or client certificates (any local user could reach it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from ragserve.config import Settings
from ragserve.errors import ConfigError, InvalidArgument, RagError
from ragserve.server.front import Front
from ragserve.server.gate import Door, request_id_from
from ragserve.server.openai_wire import ChatRequest, Reply, ask_of, error_body, http_error, json_response, parse_chat
from ragserve.types import RequestClass

log = logging.getLogger(__name__)

METHOD = "ChatCompletions"  # the metrics' and logs' method name for this door's calls
_SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


class Refused(Exception):
    """A call turned away before it reaches the front (the caller, the body's type, size and time)."""

    def __init__(
        self, status: int, message: str, kind: str, headers: dict[str, str] | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.response = json_response(status, error_body(message, kind, None, code), headers)

    @classmethod
    def of(cls, error: RagError) -> Refused:
        """A front refusal (the caller's credential) in the door's one table's shape."""
        status, body, headers = http_error(error)
        return cls(status, str(error), body["error"]["type"], headers, body["error"]["code"])


class OpenAIDoor:
    """The door's ASGI app (`app`), over the front every door shares (server/front.py)."""

    def __init__(self, settings: Settings, front: Front, beside: Sequence[BaseRoute] = ()) -> None:
        """`beside`: other doors' routes on the same listener (the MCP door's /mcp)."""
        check_door_protected(settings)
        self._settings = settings
        self._front = front
        self._model = settings.openai.model_name
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", _ChatEndpoint(self), methods=["POST"]),
                Route("/v1/models", self.models, methods=["GET"]),
                *beside,
            ],
            exception_handlers={HTTPException: _http_exception},
        )

    def caller(self, request: Request) -> set[str]:
        """The names the caller goes by, once what it presented passes (401 or 403 otherwise)."""
        names: set[str] = request.scope.get("state", {}).get("client_ids", set())
        try:
            return self._front.identity.caller(request.headers.get("authorization"), names)
        except RagError as error:
            raise Refused.of(error) from None

    async def models(self, request: Request) -> Response:
        try:
            self.caller(request)
        except Refused as refused:
            return refused.response
        model = {"id": self._model, "object": "model", "created": 0, "owned_by": "ragserve"}
        return json_response(200, {"object": "list", "data": [model]})

    async def read_body(self, request: Request) -> bytes:
        """The body, refused (413) past RAGSERVE_OPENAI_MAX_BODY_BYTES before it is all read, and
        (408, the connection closed) when it is not all there within RAGSERVE_OPENAI_BODY_TIMEOUT_S."""
        timeout_s = self._settings.openai.body_timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                return await self._read_body(request)
        except TimeoutError:
            message = f"the body did not arrive within {timeout_s:g} s (RAGSERVE_OPENAI_BODY_TIMEOUT_S)"
            raise Refused(408, message, "invalid_request_error", {"connection": "close"}) from None

    async def _read_body(self, request: Request) -> bytes:
        limit = self._settings.openai.max_body_bytes
        declared = request.headers.get("content-length", "")
        too_big = Refused(
            413, f"the body is over {limit} bytes (RAGSERVE_OPENAI_MAX_BODY_BYTES)", "invalid_request_error"
        )
        if declared.isdigit() and int(declared) > limit:
            raise too_big
        body = bytearray()
        async for part in request.stream():
            body += part
            if len(body) > limit:
                raise too_big
        return bytes(body)

    async def chat(self, request: Request, body: bytes, names: set[str], send: Send) -> None:
        """One chat completion, from the parsed body to its last byte; every failure a status."""
        request_id = request_id_from(request.headers.get("x-request-id"))
        sse = _Stream(send, request_id)

        async def fail(error: RagError) -> None:
            await sse.fail(*http_error(error))

        async with self._front.outcome(METHOD, request_id, fail) as arrived:
            chat, asked = parse_chat(body)
            door = Door(request_id, _class_of(request, chat), names, None, list(request.headers.items()))
            async with self._front.enter(METHOD, door, arrived) as call:
                reply = Reply(request_id, self._model, bool(chat.stream_options and chat.stream_options.include_usage))
                # Closed now: a client gone aborts the engine request.
                async with contextlib.aclosing(self._front.query(call, ask_of(chat, asked), names)) as events:
                    if chat.stream:
                        async for event in events:
                            await sse.send(reply.chunks(event))
                        await sse.done()
                    else:
                        collected = [event async for event in events]
                        await sse.whole(json_response(200, reply.completion(collected), sse.id_header))


class _ChatEndpoint:
    """The chat route as an ASGI app: the body is read first, then the call runs in a task of its
    own while this one waits for the client to go (and then cancels it)."""

    def __init__(self, door: OpenAIDoor) -> None:
        self._door = door

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            names = self._door.caller(request)
            _require_json(request)
            body = await self._door.read_body(request)
        except Refused as refused:
            await refused.response(scope, receive, send)
            return
        except ClientDisconnect:  # nobody left to answer: one line, not uvicorn's traceback
            log.info(
                "client left before its request body arrived",
                extra={"request_id": request_id_from(request.headers.get("x-request-id")), "method": METHOD},
            )
            return
        work = asyncio.create_task(self._door.chat(request, body, names, send))
        gone = asyncio.create_task(_disconnected(receive))
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not work.done():
                work.cancel()  # the client left (or this task was cancelled): stop the call's work
            with contextlib.suppress(asyncio.CancelledError):
                await work


def _require_json(request: Request) -> None:
    media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media != "application/json":
        raise Refused(415, "Content-Type must be application/json", "invalid_request_error")


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class _Stream:
    """The response as it goes out: server-sent events once the first chunk is sent, else one JSON
    body (a failure before any byte gets its own status)."""

    def __init__(self, send: Send, request_id: str) -> None:
        self._send = send
        self.started = False
        self.id_header = {"x-request-id": request_id}

    async def send(self, chunks: list[dict[str, Any]]) -> None:
        if not self.started:
            headers = [*_SSE_HEADERS, (b"x-request-id", self.id_header["x-request-id"].encode())]
            await self._send({"type": "http.response.start", "status": 200, "headers": headers})
            self.started = True
        data = b"".join(b"data: " + orjson.dumps(chunk) + b"\n\n" for chunk in chunks)
        await self._send({"type": "http.response.body", "body": data, "more_body": True})

    async def done(self) -> None:
        await self._send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})

    async def whole(self, response: Response) -> None:
        self.started = True
        await response({"type": "http"}, _no_receive, self._send)

    async def fail(self, status: int, body: dict[str, Any], headers: dict[str, str]) -> None:
        """An error as its status and body, or, once events went out, as a last `error` event (the
        OpenAI SDKs raise it)."""
        if not self.started:
            await self.whole(json_response(status, body, {**headers, **self.id_header}))
            return
        data = b"data: " + orjson.dumps(body) + b"\n\n"
        await self._send({"type": "http.response.body", "body": data, "more_body": False})


async def _no_receive() -> dict[str, Any]:  # a whole response never reads the request
    return {"type": "http.disconnect"}


def _class_of(request: Request, chat: ChatRequest) -> RequestClass:
    """The `x-request-class` header, else the body's `request_class`, else interactive."""
    named = request.headers.get("x-request-class") or chat.request_class or "interactive"
    if named not in ("interactive", "batch"):
        raise InvalidArgument("x-request-class", f"must be interactive or batch, got {named!r}")
    return RequestClass(named)


async def _http_exception(request: Request, exc: Exception) -> Response:
    """Starlette's own refusals (an unknown path, a wrong method) in the OpenAI error shape."""
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    kind = "not_found_error" if status == 404 else "invalid_request_error"
    return json_response(status, error_body(f"{request.method} {request.url.path}: {exc}", kind))


def check_door_protected(settings: Settings) -> None:
    """Beside a 0600 Unix socket a loopback door would let any local user in: it needs a token or
    client certificates then (off loopback, server/auth.py's exposure rules already ask for them)."""
    access = settings.access
    certificates = bool(access.tls_cert_file and access.tls_key_file and access.tls_client_ca_file)
    if settings.transport.uds_path and not (access.auth_token or access.api_keys_file or certificates):
        raise ConfigError(
            f"the OpenAI-compatible door (RAGSERVE_OPENAI_PORT={settings.openai.port}) would let any local "
            "user past the private Unix socket (RAGSERVE_UDS_PATH): set RAGSERVE_AUTH_TOKEN or "
            "RAGSERVE_API_KEYS_FILE, or TLS with client certificates "
            "(RAGSERVE_TLS_CERT_FILE, RAGSERVE_TLS_KEY_FILE, RAGSERVE_TLS_CLIENT_CA_FILE)"
        )
