"""The page's routes: its files, and three small JSON calls the stream does not carry, each through
the front like every door's (the caller's credential, the call gate, the outcome's status, metric
and log line):

- GET /ui/api/info: Info as the gRPC door gives it (index version, warming, engine settings);
- GET /ui/api/fields: the fields a filter may name (MCP's `fields`);
- GET /ui/api/source?chunk_id=&start=&end=: a citation's quote in its document, within the
  caller's grant (the gRPC Source method).

The answer itself comes from POST /v1/chat/completions with stream: true, the OpenAI door's own
route: the page adds no work to a Query on any door."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from google.protobuf.json_format import MessageToDict
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from ragserve.config import Settings
from ragserve.errors import InvalidArgument, RagError
from ragserve.request.source_view import DEFAULT_CONTEXT_CHARS
from ragserve.server.convert import info_response_pb, source_response_pb
from ragserve.server.front import Front
from ragserve.server.gate import Door, request_id_from
from ragserve.server.http.errors import http_error, json_response
from ragserve.server.page.assets import SECURITY_HEADERS, AssetEndpoint, load_assets
from ragserve.types import RequestClass

PREFIX = "/ui"
_API_HEADERS = {**SECURITY_HEADERS, "cache-control": "no-store"}

# One call's work, given the caller's names: its JSON body.
Work = Callable[[set[str]], Awaitable[dict[str, Any]]]


def page_routes(front: Front, settings: Settings) -> list[BaseRoute]:
    """The page's routes for the HTTP app (none unless RAGSERVE_PAGE_ENABLED)."""
    if not settings.page.enabled:
        return []
    api = PageApi(front)
    files = AssetEndpoint(load_assets())
    return [
        Route(PREFIX, lambda _request: RedirectResponse(f"{PREFIX}/", 308), methods=["GET"]),
        Route(f"{PREFIX}/", files.serve, methods=["GET"]),
        Route(f"{PREFIX}/static/{{name}}", files.serve, methods=["GET"]),
        Route(f"{PREFIX}/api/info", api.info, methods=["GET"]),
        Route(f"{PREFIX}/api/fields", api.fields, methods=["GET"]),
        Route(f"{PREFIX}/api/source", api.source, methods=["GET"]),
    ]


class PageApi:
    def __init__(self, front: Front) -> None:
        self._front = front

    async def info(self, request: Request) -> Response:
        async def work(names: set[str]) -> dict[str, Any]:
            info, in_flight = await self._front.info(names)
            message = info_response_pb(info, self._front.retrieval_budget_ms, in_flight)
            return dict(MessageToDict(message, preserving_proto_field_name=True))

        return await self._call(request, "PageInfo", work)

    async def fields(self, request: Request) -> Response:
        async def work(_names: set[str]) -> dict[str, Any]:
            return {"fields": dict(self._front.fields())}

        return await self._call(request, "PageFields", work)

    async def source(self, request: Request) -> Response:
        query = request.query_params

        async def work(names: set[str]) -> dict[str, Any]:
            start, end = _offset(query.get("start"), "start"), _offset(query.get("end"), "end")
            chunk_id = query.get("chunk_id", "")
            view, version = await self._front.source(chunk_id, start, end, DEFAULT_CONTEXT_CHARS, names)
            body = dict(MessageToDict(source_response_pb(view, version), preserving_proto_field_name=True))
            return {**body, "found": view is not None, "chunk_id": chunk_id}

        return await self._call(request, "PageSource", work)

    async def _call(self, request: Request, method: str, work: Work) -> Response:
        """The credential first (401/403 as on the OpenAI door), then the front's outcome and gate."""
        request_id = request_id_from(request.headers.get("x-request-id"))
        id_header = {**_API_HEADERS, "x-request-id": request_id}
        certificates: set[str] = request.scope.get("state", {}).get("client_ids", set())
        try:
            names = self._front.identity.caller(request.headers.get("authorization"), certificates)
        except RagError as error:
            return _error(error, id_header)
        answered: list[Response] = []

        async def fail(error: RagError) -> None:
            answered.append(_error(error, id_header))

        async with self._front.outcome(method, request_id, fail) as arrived:
            door = Door(request_id, RequestClass.INTERACTIVE, names, None, list(request.headers.items()))
            async with self._front.enter(method, door, arrived):
                answered.append(json_response(200, await work(names), id_header))
        return answered[-1]


def _error(error: RagError, headers: dict[str, str]) -> Response:
    status, body, extra = http_error(error)
    response: Response = json_response(status, body, {**headers, **extra})
    return response


def _offset(value: str | None, name: str) -> int | None:
    """A citation's quote_start or quote_end; absent or empty: the chunk's own range."""
    if value is None or value == "":
        return None
    if not value.isdigit() or len(value) > 10:
        raise InvalidArgument(name, "must be a character offset (a whole number, 0 or more)")
    return int(value)
