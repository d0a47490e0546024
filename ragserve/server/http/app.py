"""The one app of the HTTP listener, built from every HTTP door's routes (the OpenAI door's, the
MCP door's, the page's when it is on), side by side: no door runs inside another. Around them,
what every HTTP request passes: at most RAGSERVE_HTTP_MAX_REQUESTS_PER_CALLER open requests per
caller (from its headers to its answer's last byte, a body still arriving included: 429 and the
connection closed past it), and Starlette's own refusals in the one error table's shape."""

from __future__ import annotations

import collections
from collections.abc import Sequence

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from ragserve.config import HttpSettings
from ragserve.errors import RagError
from ragserve.server.http.body import certificate_names_of, first_header
from ragserve.server.http.errors import error_body, json_response
from ragserve.server.identity import Identity


def http_app(routes: Sequence[BaseRoute], identity: Identity, limits: HttpSettings) -> ASGIApp:
    """Every HTTP door's routes on one Starlette app, each caller's open requests bounded."""
    app = Starlette(routes=list(routes), exception_handlers={HTTPException: _http_exception})
    return CallerRequests(app, identity, limits.max_requests_per_caller)


class CallerRequests:
    """A caller's open requests, counted by the names it goes by (its key, token or certificate
    names; a request whose credential fails is the door's to refuse, uncounted)."""

    def __init__(self, app: ASGIApp, identity: Identity, limit: int) -> None:
        self._app = app
        self._identity = identity
        self._limit = limit
        self._open: collections.Counter[frozenset[str]] = collections.Counter()

    def open_for(self, names: set[str]) -> int:
        return self._open[frozenset(names)]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        try:
            key = frozenset(self._identity.caller(first_header(scope, b"authorization"), certificate_names_of(scope)))
        except RagError:
            await self._app(scope, receive, send)  # the door answers 401 or 403 before reading any body
            return
        if self._open[key] >= self._limit:
            message = f"this caller has {self._limit} requests open (RAGSERVE_HTTP_MAX_REQUESTS_PER_CALLER)"
            body = error_body(message, "rate_limit_error", None, "resource_exhausted")
            await json_response(429, body, {"connection": "close", "retry-after": "1"})(scope, receive, send)
            return
        self._open[key] += 1
        try:
            await self._app(scope, receive, send)
        finally:
            self._open[key] -= 1
            if not self._open[key]:
                del self._open[key]


async def _http_exception(request: Request, exc: Exception) -> Response:
    """Starlette's own refusals (an unknown path, a wrong method) in the one table's shape."""
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    kind = "not_found_error" if status == 404 else "invalid_request_error"
    headers = dict(exc.headers) if isinstance(exc, HTTPException) and exc.headers else None
    return json_response(status, error_body(f"{request.method} {request.url.path}: {exc}", kind), headers)
