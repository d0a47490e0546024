"""The MCP door: the Model Context Protocol's streamable HTTP transport, stateless, at /mcp on the
HTTP listener (RAGSERVE_MCP_ENABLED), on the official SDK (mcp 2.x, its MCPServer). Four read-only
tools, each a thin mapping over the front every door shares (server/front.py): `search`, `answer`,
`fetch` and `fields`. Grants, caller limits, request classes, the call's clock and the error kinds
are those of every door; a failure is a tool error that names the argument.

Before the SDK sees a request, the door checks what every HTTP door checks (server/http/): the
caller's credential (401, the first Authorization header, as on every door), the body in size and
in time (413; 408 past RAGSERVE_HTTP_BODY_TIMEOUT_S, as the OpenAI door answers) and, as the MCP
transport asks against DNS rebinding, the Origin (403 for a page of another host). GET (the SDK's
server-to-client stream) is 405: a stateless door never writes to one, so it would only hold a
connection. The listener has already checked the Host header, the connection cap and the header
deadline, and bounds each caller's open requests (server/http/app.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings
from mcp.types import CallToolResult, ToolAnnotations
from pydantic import BaseModel, Field
from starlette.requests import ClientDisconnect, Request
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from ragserve.config import Settings
from ragserve.errors import InvalidArgument, RagError
from ragserve.request.source_view import DEFAULT_CONTEXT_CHARS
from ragserve.server.front import Ask, Front
from ragserve.server.gate import Call, Door, request_id_from
from ragserve.server.http.body import Refused, certificate_names_of, first_header, read_body, replay
from ragserve.server.http.errors import error_response
from ragserve.server.http.host import origin_refusal
from ragserve.server.mcp.results import answer_result, fetch_result, fields_result, search_result, source_result
from ragserve.types import RequestClass

log = logging.getLogger(__name__)

_READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False)
_NAMES_KEY = "ragserve_caller_names"

Filter = Annotated[
    dict[str, Any] | None,
    Field(description="Qdrant's filter shape: must / should / must_not of {key, match|range|is_empty}; see `fields`"),
]
RequestClassArg = Annotated[
    Literal["interactive", "batch"] | None,
    Field(description="batch for background work: it never delays interactive callers"),
]


class HistoryTurn(BaseModel):
    role: Literal["user", "assistant"]
    text: str


class McpDoor:
    """`routes` go on the HTTP listener's app; `start()` before it serves, `close()` after."""

    def __init__(self, settings: Settings, front: Front) -> None:
        self._front = front
        self._limits = settings.http
        self._default_class = RequestClass(settings.mcp.request_class)
        server = _quiet_server()
        self._register(server)
        # Stateless, with server-sent events (progress notifications; a client gone cancels the
        # tool). The listener checks Host for every door (421): the SDK's own check stays off.
        server.streamable_http_app(
            stateless_http=True,
            json_response=False,
            max_request_body_size=settings.http.max_body_bytes,
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        self._manager = server.session_manager
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        # POST only: a stateless door has no stream to offer on GET and no session to DELETE (405).
        self.routes: list[BaseRoute] = [Route("/mcp", _Endpoint(self), methods=["POST"])]

    async def start(self) -> None:
        """The SDK's session manager runs in a task of its own (its task group is entered and left
        in one task), until `close()`."""
        entered, self._stop = asyncio.Event(), asyncio.Event()

        async def run() -> None:
            async with self._manager.run():
                entered.set()
                await self._stop.wait()

        self._task = asyncio.create_task(run())
        await asyncio.wait({self._task, asyncio.create_task(entered.wait())}, return_when=asyncio.FIRST_COMPLETED)
        if self._task.done():
            self._task.result()  # it failed to start: raise why

    async def close(self) -> None:
        if self._task is not None:
            self._stop.set()
            await self._task
            self._task = None

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        refusal = origin_refusal(scope, self._limits.allowed_origin_names)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        try:
            names = self._front.identity.caller(first_header(scope, b"authorization"), certificate_names_of(scope))
        except RagError as error:
            await error_response(error)(scope, receive, send)
            return
        request = Request(scope, receive)
        try:
            body = await read_body(request, self._limits)
        except Refused as refused:
            await refused.response(scope, receive, send)
            return
        except ClientDisconnect:  # nobody left to answer: one line, not a traceback
            request_id = request_id_from(request.headers.get("x-request-id"))
            log.info("client left before its request body arrived", extra={"request_id": request_id, "method": "Mcp"})
            return
        scope.setdefault("state", {})[_NAMES_KEY] = names
        await self._manager.handle_request(scope, replay(body, receive), send)

    @contextlib.asynccontextmanager
    async def _call(self, tool: str, ctx: Context, asked_class: str | None) -> AsyncIterator[tuple[Call, set[str]]]:
        """The front's outcome and admission around one tool call; a failure is a tool error."""
        request = ctx.request_context.request
        headers = request.headers if request is not None else {}
        names: set[str] = request.scope.get("state", {}).get(_NAMES_KEY, set()) if request is not None else set()
        request_id = request_id_from(headers.get("x-request-id"))

        async def fail(error: RagError) -> None:
            where = f"{error.field}: {error.description}" if isinstance(error, InvalidArgument) else str(error)
            raise ToolError(f"{error.kind.value}: {where}")

        method = f"Mcp{tool.capitalize()}"
        async with self._front.outcome(method, request_id, fail) as arrived:
            trace = list(headers.items()) if request is not None else None  # a caller's traceparent
            door = Door(request_id, self._class(asked_class, headers.get("x-request-class")), names, None, trace)
            async with self._front.enter(method, door, arrived) as call:
                yield call, names

    def _class(self, argument: str | None, header: str | None) -> RequestClass:
        named = argument or header or self._default_class.value
        if named not in ("interactive", "batch"):
            raise InvalidArgument("x-request-class", f"must be interactive or batch, got {named!r}")
        return RequestClass(named)

    def _register(self, server: MCPServer) -> None:
        server.add_tool(self.search, name="search", annotations=_READ_ONLY, structured_output=False)
        server.add_tool(self.answer, name="answer", annotations=_READ_ONLY, structured_output=False)
        server.add_tool(self.fetch, name="fetch", annotations=_READ_ONLY, structured_output=False)
        server.add_tool(self.fields, name="fields", annotations=_READ_ONLY, structured_output=False)

    async def search(
        self,
        query: Annotated[str, Field(description="What to look for, in words")],
        ctx: Context,
        top_k: Annotated[int, Field(description="How many passages (0: the server's default)", ge=0)] = 0,
        filter: Filter = None,
        request_class: RequestClassArg = None,
    ) -> CallToolResult:
        """Passages of the indexed documents that answer `query`, best first, each with its document
        and chunk id, title, text, score and the sentence that best matches (its highlight)."""
        async with self._call("search", ctx, request_class) as (call, names):
            result = await self._front.retrieve(call, Ask(query, top_k, filter=filter), names)
        return search_result(result)

    async def answer(
        self,
        question: Annotated[str, Field(description="The question, in words")],
        ctx: Context,
        history: Annotated[list[HistoryTurn] | None, Field(description="Earlier turns, oldest first")] = None,
        filter: Filter = None,
        request_class: RequestClassArg = None,
    ) -> CallToolResult:
        """A short answer written only from the indexed documents, with citations [n] resolved to
        passages and the quoted sentence; `declined` when the documents do not say."""
        turns = tuple((turn.role, turn.text) for turn in history or ())
        async with self._call("answer", ctx, request_class) as (call, names):
            events = []
            ask = Ask(question, filter=filter, turns=turns, question_field="question")
            async with contextlib.aclosing(self._front.query(call, ask, names)) as stream:
                async for event in stream:
                    events.append(event)
                    await _progress(ctx, event)
        return answer_result(events)

    async def fetch(
        self,
        ctx: Context,
        chunk_id: Annotated[str, Field(description="A passage's chunk_id, as search returns it")] = "",
        doc_id: Annotated[str, Field(description="Or a document's doc_id: all its passages, in order")] = "",
        quote_start: Annotated[int, Field(description="A citation's quote_start: the source around it")] = -1,
        quote_end: Annotated[int, Field(description="The citation's quote_end")] = -1,
    ) -> CallToolResult:
        """A passage's (or a whole document's) text and metadata, when this caller may read it; with
        a citation's quote_start and quote_end, the document's text around that quote, marked."""
        async with self._call("fetch", ctx, None) as (_call, names):
            if quote_start >= 0 or quote_end >= 0:
                start, end = max(quote_start, 0), max(quote_end, quote_start, 0)
                view, version = await self._front.source(chunk_id, start, end, DEFAULT_CONTEXT_CHARS, names)
                return source_result(view, version)
            chunks, version = await self._front.fetch(chunk_id, doc_id, names)
        return fetch_result(chunks, version)

    async def fields(self, ctx: Context) -> CallToolResult:
        """The fields a filter may name and their types (keyword, integer, float, bool, datetime)."""
        async with self._call("fields", ctx, None):
            schema = self._front.fields()
        return fields_result(schema)


async def _progress(ctx: Context, event: object) -> None:
    """Where the client asked for progress: passages found, then the answer done."""
    from ragserve.events import FinalSummary
    from ragserve.types import RetrievalResult

    if isinstance(event, RetrievalResult):
        await ctx.report_progress(1, 2, f"{len(event.passages)} passages found; answering")
    elif isinstance(event, FinalSummary):
        await ctx.report_progress(2, 2, "answered")


class _Endpoint:
    """/mcp as a plain ASGI app (a class instance: Starlette passes scope, receive and send)."""

    def __init__(self, door: McpDoor) -> None:
        self._door = door

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._door.handle(scope, receive, send)


def _quiet_server() -> MCPServer:
    """The SDK's server, without the root log handler its constructor installs where the root logger
    has none yet (logging.basicConfig): the server's own logging stays as configured."""
    root = logging.getLogger()
    placeholder = logging.NullHandler()
    root.addHandler(placeholder)
    try:
        return MCPServer(
            "ragserve",
            instructions="Search and answer from the documents this server indexes; "
            "`fields` lists what a filter may name.",
        )
    finally:
        root.removeHandler(placeholder)
