"""The OpenAI-compatible HTTP door: POST /v1/chat/completions (server-sent events or one JSON body)
and GET /v1/models, on Starlette served by uvicorn on the gRPC server's event loop. The same
pipeline, call gate (admission by class and caller, the call's clock), access grants, bearer token
and TLS files as the gRPC port; conversion lives in server/openai/wire.py, the listener, its limits
and the error table in server/http/.

A client gone (the connection closed) cancels the call: the pipeline's stream is closed, which
aborts the engine request, as a cancelled gRPC call does.

What a browser can be made to send is refused before any of it: a Host header that names no host
this door answers to (421: DNS rebinding), and a POST whose Content-Type is not application/json
(415: a cross-site form or text/plain POST needs no CORS preflight).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from ragserve.config import Settings
from ragserve.errors import InvalidArgument, RagError
from ragserve.server.front import Front
from ragserve.server.gate import Door, request_id_from
from ragserve.server.http.body import Refused, certificate_names_of, first_header, read_body, require_json
from ragserve.server.http.errors import http_error, json_response
from ragserve.server.openai.wire import ChatRequest, Reply, ask_of, parse_chat
from ragserve.types import RequestClass

log = logging.getLogger(__name__)

METHOD = "ChatCompletions"  # the metrics' and logs' method name for this door's calls
_SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


class OpenAIDoor:
    """The door's routes (`routes`), over the front every door shares (server/front.py)."""

    def __init__(self, settings: Settings, front: Front) -> None:
        self._settings = settings
        self._front = front
        self._model = settings.openai.model_name
        # Its routes, for the HTTP listener's one app (server/http/app.py), beside the other doors'.
        self.routes: list[BaseRoute] = [
            Route("/v1/chat/completions", _ChatEndpoint(self), methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
        ]

    def caller(self, request: Request) -> set[str]:
        """The names the caller goes by, once what it presented passes (401 or 403 otherwise)."""
        names = certificate_names_of(request.scope)
        try:
            return self._front.identity.caller(first_header(request.scope, b"authorization"), names)
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
        return await read_body(request, self._settings.http)

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
            require_json(request)
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
