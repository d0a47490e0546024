"""RagService over grpc.aio: validate, build the Deadline, call the pipeline, convert, map errors."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from typing import NoReturn

import grpc

from ragserve.budget import Deadline
from ragserve.config import Settings
from ragserve.errors import RagError, Unavailable
from ragserve.limiter import InFlightLimiter
from ragserve.pipeline import RagPipeline
from ragserve.server.convert import query_event_pb, retrieve_response_pb
from ragserve.server.status import to_status
from ragserve.types import FinalSummary, RetrievalResult
from ragserve.v1 import rag_pb2 as pb
from ragserve.v1 import rag_pb2_grpc as pb_grpc
from ragserve.validation import validate_generate, validate_retrieve

log = logging.getLogger(__name__)


async def _abort(context: grpc.aio.ServicerContext, error: RagError, request_id: str, method: str) -> NoReturn:
    status = to_status(error)
    log.info("%s %s failed: %s %s", method, request_id, status.code.name, type(error).__name__)
    await context.abort_with_status(status)
    raise AssertionError("abort_with_status returned")  # pragma: no cover


class RagServicer(pb_grpc.RagServiceServicer):  # type: ignore[misc]
    def __init__(self, settings: Settings, limiter: InFlightLimiter, pipeline: RagPipeline | None = None) -> None:
        # None until loading finishes: the port opens (health NOT_SERVING) before warm-up ends.
        self.pipeline = pipeline
        self._settings = settings
        self._limiter = limiter

    def _ready(self) -> RagPipeline:
        if self.pipeline is None:
            raise Unavailable("server is still loading the index and models")
        return self.pipeline

    def _deadline(self, budget_ms: int, context: grpc.aio.ServicerContext) -> Deadline:
        return Deadline(budget_ms, client_timeout_s=context.time_remaining())

    async def Retrieve(self, request: pb.RetrieveRequest, context: grpc.aio.ServicerContext) -> pb.RetrieveResponse:
        request_id = uuid.uuid4().hex
        try:
            with self._limiter.admit():
                params = validate_retrieve(self._settings, request.query, request.top_k, request.budget_ms)
                result = await self._ready().retrieve(params, self._deadline(params.budget_ms, context))
        except RagError as error:
            await _abort(context, error, request_id, "Retrieve")
        log.info(
            "Retrieve %s ok: %d passages in %.1f ms (docs %s)",
            request_id,
            len(result.passages),
            result.timings.retrieval_total_ms,
            [p.chunk.doc_id for p in result.passages],
        )
        return retrieve_response_pb(result)

    async def Query(self, request: pb.QueryRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[pb.QueryEvent]:
        request_id = uuid.uuid4().hex
        try:
            with self._limiter.admit():
                params = validate_retrieve(self._settings, request.query, request.top_k, request.budget_ms)
                gen = validate_generate(self._settings, request.max_tokens, request.temperature)
                deadline = self._deadline(params.budget_ms, context)
                async for event in self._ready().query(params, gen, deadline, request_id):
                    if isinstance(event, RetrievalResult):
                        log.info("Query %s retrieved docs %s", request_id, [p.chunk.doc_id for p in event.passages])
                    elif isinstance(event, FinalSummary):
                        log.info(
                            "Query %s ok: %d prompt tokens (%d cached), %d completion tokens, ttft %.0f ms",
                            request_id,
                            event.usage.prompt_tokens,
                            event.usage.prefix_cache_hit_tokens,
                            event.usage.completion_tokens,
                            event.timings.ttft_ms,
                        )
                    yield query_event_pb(event)
        except RagError as error:
            await _abort(context, error, request_id, "Query")

    async def Info(self, request: pb.InfoRequest, context: grpc.aio.ServicerContext) -> pb.InfoResponse:
        try:
            pipeline = self._ready()
        except RagError as error:
            await _abort(context, error, "-", "Info")
        return pb.InfoResponse(
            index_version=pipeline.index.version,
            index_chunks=pipeline.index.count,
            embedder_model=pipeline.embedder.model_id,
            generator_model=pipeline.generator.model_id if pipeline.generator else "",
            rerank_tiers=[],
            retrieval_budget_ms=self._settings.retrieval_budget_ms,
        )
