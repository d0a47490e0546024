"""RagService over grpc.aio, a thin door over the front (server/front.py): each method maps the wire
to an Ask, calls the front, and maps the result back; a failure goes out as the status of its kind
(server/grpc/status.py)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncGenerator, AsyncIterator

import grpc
from google.protobuf.json_format import MessageToDict

from ragserve.errors import RagError
from ragserve.events import QueryEvent
from ragserve.request.source_view import DEFAULT_CONTEXT_CHARS
from ragserve.server.convert import info_response_pb, query_event_pb, retrieve_response_pb, source_response_pb
from ragserve.server.front import Ask, Front
from ragserve.server.gate import Call, Door, request_id_from
from ragserve.server.grpc.auth import client_ids, metadata_value
from ragserve.server.grpc.status import to_status
from ragserve.server.validation import validate_request_class
from ragserve.v1 import rag_pb2 as pb
from ragserve.v1 import rag_pb2_grpc as pb_grpc

# The wire's Turn.Role numbers (rag.proto) as the core names them; others are refused by validation.
_ROLES = {pb.Turn.ROLE_USER: "user", pb.Turn.ROLE_ASSISTANT: "assistant"}


def _role_name(number: int) -> str:
    return pb.Turn.Role.Name(number) if number in pb.Turn.Role.values() else str(number)


def ask_of(request: pb.RetrieveRequest | pb.QueryRequest) -> Ask:
    raw = MessageToDict(request.filter, preserving_proto_field_name=True) if request.HasField("filter") else None
    retrieval = Ask(request.query, request.top_k, request.budget_ms, request.dedupe_documents, raw)
    if isinstance(request, pb.RetrieveRequest):
        return retrieval
    return dataclasses.replace(
        retrieval,
        max_tokens=request.max_tokens,
        temperature=request.temperature,
        context_token_budget=request.context_token_budget if request.HasField("context_token_budget") else None,
        turns=tuple((_ROLES.get(t.role, _role_name(t.role)), t.text) for t in request.history),
    )


class RagServicer(pb_grpc.RagServiceServicer):  # type: ignore[misc]
    def __init__(self, front: Front) -> None:
        self.front = front

    def _names(self, context: grpc.aio.ServicerContext) -> set[str]:
        """The caller's names (the interceptors already refused a caller the identity refuses)."""
        return self.front.identity.caller(metadata_value(context, "authorization"), client_ids(context))

    @contextlib.asynccontextmanager
    async def _call(
        self, method: str, context: grpc.aio.ServicerContext, request_class: int = 0
    ) -> AsyncIterator[tuple[Call, set[str]]]:
        """The front's outcome and admission around one method; a failure aborts with its status.
        Past the call's end the body is cancelled wherever it waits (the engine, or a write to a
        client that stopped reading), and the slot is freed before DEADLINE_EXCEEDED is queued."""
        request_id = request_id_from(metadata_value(context, "x-request-id"))

        async def fail(error: RagError) -> None:
            await context.abort_with_status(to_status(error))

        async with self.front.outcome(method, request_id, fail, passthrough=(grpc.aio.AbortError,)) as arrived:
            asked = validate_request_class(request_class)  # admission depends on it: checked first
            names = self._names(context)
            door = Door(request_id, asked, names, context.time_remaining(), context.invocation_metadata())
            async with self.front.enter(method, door, arrived) as call:
                yield call, names

    async def Retrieve(self, request: pb.RetrieveRequest, context: grpc.aio.ServicerContext) -> pb.RetrieveResponse:
        async with self._call("Retrieve", context, request.request_class) as (call, names):
            result = await self.front.retrieve(call, ask_of(request), names, request.answer_span)
            return retrieve_response_pb(result)
        raise AssertionError("the front returned without a response")  # pragma: no cover (it aborts instead)

    async def Query(self, request: pb.QueryRequest, context: grpc.aio.ServicerContext) -> None:
        # Written with context.write, not yielded: a write stuck behind a client that stopped reading
        # then runs inside the call's time (a yielded message is sent by grpc, outside it).
        async with self._call("Query", context, request.request_class) as (call, names):
            await self._write(context, self.front.query(call, ask_of(request), names))

    @staticmethod
    async def _write(context: grpc.aio.ServicerContext, answer: AsyncGenerator[QueryEvent, None]) -> None:
        # Closed now, not when garbage collected: closing the stream aborts the engine request.
        async with contextlib.aclosing(answer) as events:
            async for event in events:
                await context.write(query_event_pb(event))

    async def Source(self, request: pb.SourceRequest, context: grpc.aio.ServicerContext) -> pb.SourceResponse:
        start = request.start if request.HasField("start") else None
        end = request.end if request.HasField("end") else None
        context_chars = request.context_chars if request.HasField("context_chars") else DEFAULT_CONTEXT_CHARS
        async with self._call("Source", context) as (_call, names):
            view, version = await self.front.source(request.chunk_id, start, end, context_chars, names)
            return source_response_pb(view, version)
        raise AssertionError("the front returned without a response")  # pragma: no cover (it aborts instead)

    async def Info(self, request: pb.InfoRequest, context: grpc.aio.ServicerContext) -> pb.InfoResponse:
        async with self._call("Info", context) as (_call, names):
            info, others = await self.front.info(names)
            return info_response_pb(info, self.front.retrieval_budget_ms, others)
        raise AssertionError("the front returned without a response")  # pragma: no cover (it aborts instead)
