"""RagService over grpc.aio: each method is convert -> pipeline -> convert, inside the call gate
(server/gate.py) that owns everything else about a call."""

from __future__ import annotations

from collections.abc import AsyncGenerator

import grpc
from google.protobuf.json_format import MessageToDict

from ragserve.config import Settings
from ragserve.errors import Unavailable
from ragserve.request.pipeline import RagPipeline
from ragserve.server.auth import client_ids
from ragserve.server.convert import info_response_pb, query_event_pb, retrieve_response_pb
from ragserve.server.gate import CallGate, log_answer, log_retrieval
from ragserve.server.validation import (
    Narrowing,
    validate_generate,
    validate_history,
    validate_retrieve,
    with_history,
)
from ragserve.types import FinalSummary, RetrievalResult, RetrieveParams
from ragserve.v1 import rag_pb2 as pb
from ragserve.v1 import rag_pb2_grpc as pb_grpc

# The wire's Turn.Role numbers (rag.proto) as the core names them; others are refused by validation.
_ROLES = {pb.Turn.ROLE_USER: "user", pb.Turn.ROLE_ASSISTANT: "assistant"}


def _role_name(number: int) -> str:
    return pb.Turn.Role.Name(number) if number in pb.Turn.Role.values() else str(number)


class RagServicer(pb_grpc.RagServiceServicer):  # type: ignore[misc]
    def __init__(self, settings: Settings, gate: CallGate, pipeline: RagPipeline | None = None) -> None:
        # None until loading finishes: the port opens (health NOT_SERVING) before warm-up ends.
        self.pipeline = pipeline
        self._settings = settings
        self._gate = gate
        self._narrowing = Narrowing(settings)

    def _ready(self) -> RagPipeline:
        if self.pipeline is None:
            raise Unavailable("server is still loading the index and models")
        return self.pipeline

    def _retrieve_params(
        self, request: pb.RetrieveRequest | pb.QueryRequest, context: grpc.aio.ServicerContext
    ) -> RetrieveParams:
        params = validate_retrieve(
            self._settings, request.query, request.top_k, request.budget_ms, request.dedupe_documents
        )
        raw = MessageToDict(request.filter, preserving_proto_field_name=True) if request.HasField("filter") else None
        return self._narrowing.apply(params, raw, self._ready().serving.index.fields, client_ids(context))

    async def Retrieve(self, request: pb.RetrieveRequest, context: grpc.aio.ServicerContext) -> pb.RetrieveResponse:
        async with self._gate.call("Retrieve", context, request.request_class) as call:
            params = self._retrieve_params(request, context)
            result = await self._ready().retrieve(params, call.request(params.budget_ms), request.answer_span)
            log_retrieval(call, result)
            return retrieve_response_pb(result)
        raise AssertionError("the gate returned without a response")  # pragma: no cover (it aborts instead)

    async def Query(self, request: pb.QueryRequest, context: grpc.aio.ServicerContext) -> None:
        # Written with context.write, not yielded: a write stuck behind a client that stopped reading
        # then runs inside the call's time (a yielded message is sent by grpc, outside it).
        async with self._gate.call("Query", context, request.request_class) as call:
            params = self._retrieve_params(request, context)
            gen = validate_generate(
                self._settings,
                request.max_tokens,
                request.temperature,
                request.context_token_budget if request.HasField("context_token_budget") else None,
            )
            turns = validate_history(
                self._settings, [(_ROLES.get(t.role, _role_name(t.role)), t.text) for t in request.history]
            )
            params, gen = with_history(self._settings.history, params, gen, turns)
            events = self._ready().query(params, gen, call.request(params.budget_ms))
            try:
                async for event in events:
                    if isinstance(event, RetrievalResult):
                        log_retrieval(call, event)
                    elif isinstance(event, FinalSummary):
                        log_answer(call, event)
                    await context.write(query_event_pb(event))
            finally:
                # Now, not when garbage collected: closing the pipeline's stream aborts the engine request.
                if isinstance(events, AsyncGenerator):
                    await events.aclose()

    async def Info(self, request: pb.InfoRequest, context: grpc.aio.ServicerContext) -> pb.InfoResponse:
        # A slot like every call: its count may be a round trip to the index (request/readable.py).
        async with self._gate.call("Info", context):
            info = await self._ready().info_for(self._narrowing.access.grant_for(client_ids(context)))
            others = max(0, self._gate.in_flight - 1)  # this Info holds a slot too; it reports the rest
            return info_response_pb(info, self._settings.requests.retrieval_budget_ms, others)
        raise AssertionError("the gate returned without a response")  # pragma: no cover (it aborts instead)
