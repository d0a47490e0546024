"""RagService over grpc.aio: validate, build the Deadline, call the pipeline, convert, map errors."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import NoReturn

import grpc

from ragserve import metrics, tracing
from ragserve.budget import Deadline
from ragserve.config import Settings
from ragserve.errors import DeadlineExpired, RagError, Unavailable
from ragserve.request.pipeline import RagPipeline
from ragserve.server.auth import client_ids
from ragserve.server.convert import info_response_pb, query_event_pb, retrieve_response_pb
from ragserve.server.limiter import CallerLimits, InFlightLimiter
from ragserve.server.observability import observe_final, observe_request, observe_retrieval
from ragserve.server.status import to_status
from ragserve.server.validation import validate_generate, validate_request_class, validate_retrieve
from ragserve.types import FinalSummary, RequestClass, RetrievalResult
from ragserve.v1 import rag_pb2 as pb
from ragserve.v1 import rag_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["RagService"].full_name

_MAX_REQUEST_ID = 64


def request_id_of(context: grpc.aio.ServicerContext) -> str:
    """The caller's x-request-id when it sent a sane one, else a fresh id."""
    for key, value in context.invocation_metadata() or ():
        if (
            key == "x-request-id"
            and isinstance(value, str)
            and 0 < len(value) <= _MAX_REQUEST_ID
            and value.isprintable()
        ):
            return value
    return uuid.uuid4().hex


class _Call:
    """Per-call bookkeeping: request id, in-flight gauge, status metric and one log line at the end."""

    def __init__(self, method: str, context: grpc.aio.ServicerContext) -> None:
        self.method = method
        self.context = context
        self.request_id = request_id_of(context)
        # The request's one start, on the Deadline's clock: the call's duration, TTFT and the stage
        # totals all count from here (validation and admission included).
        self.arrived = time.monotonic()
        self.code = "OK"

    def elapsed_ms(self) -> float:
        return (time.monotonic() - self.arrived) * 1000.0

    async def fail(self, error: RagError) -> NoReturn:
        status = to_status(error)
        self.code = status.code.name
        log.info(
            "request failed",
            extra={
                "request_id": self.request_id,
                "method": self.method,
                "code": self.code,
                "error": type(error).__name__,
            },
        )
        await self.context.abort_with_status(status)
        raise AssertionError("abort_with_status returned")  # pragma: no cover

    async def crash(self, error: Exception) -> NoReturn:
        # A bug, not a caller's mistake: log it with its traceback here, send no internals to the caller.
        self.code = "INTERNAL"
        log.exception("request crashed", extra={"request_id": self.request_id, "method": self.method})
        await self.context.abort(grpc.StatusCode.INTERNAL, f"internal error (request id {self.request_id})")
        raise AssertionError("abort returned")  # pragma: no cover

    def finish(self, cancelled: bool) -> None:
        if cancelled and self.code == "OK":
            self.code = "CANCELLED"
        observe_request(self.method, self.code, self.elapsed_ms())

    @contextlib.asynccontextmanager
    async def admitted(
        self, limiter: InFlightLimiter, callers: CallerLimits, max_s: float, request_class: int = 0
    ) -> AsyncIterator[RequestClass]:
        """The call's span, its slot under the in-flight bound, its time cap, and one status for
        whatever it raises.

        The cap (RAGSERVE_MAX_CALL_S) holds whatever deadline the client set: past it the body is
        cancelled, wherever it waits (the engine, or a write to a client that stopped reading), and
        the slot is freed before the DEADLINE_EXCEEDED status is queued behind any unread messages.
        A cancelled call (client gone, deadline) ends in CancelledError, a BaseException: it passes
        through untouched and is counted as CANCELLED.
        """
        cancelled = True
        try:
            asked = validate_request_class(request_class)  # admission depends on it: checked first
            with (
                tracing.request_span(f"{SERVICE_NAME}/{self.method}", self.context.invocation_metadata()),
                callers.admit(client_ids(self.context), asked) as cls,  # at most the caller's own class
                limiter.admit(cls),
            ):
                metrics.IN_FLIGHT.inc()
                cap = asyncio.timeout(max_s)
                try:
                    async with cap:
                        yield cls
                except TimeoutError as exc:
                    if not cap.expired():
                        raise
                    raise DeadlineExpired(
                        f"the call ran longer than the server allows ({max_s:g} s, RAGSERVE_MAX_CALL_S)"
                    ) from exc
                finally:
                    metrics.IN_FLIGHT.dec()
            cancelled = False
        except RagError as error:
            cancelled = False
            await self.fail(error)
        except grpc.aio.AbortError:
            cancelled = False
            raise
        except Exception as error:
            cancelled = False
            await self.crash(error)
        finally:
            self.finish(cancelled)

    def log_retrieval(self, result: RetrievalResult) -> None:
        # Ids and sizes only: document text and the question never reach the logs.
        log.info(
            "retrieved",
            extra={
                "request_id": self.request_id,
                "method": self.method,
                "doc_ids": [p.chunk.doc_id for p in result.passages],
                "passage_chars": [len(p.chunk.text) for p in result.passages],
                "retrieval_ms": round(result.timings.retrieval_total_ms, 2),
                "cache_hit": result.cache_hit,
            },
        )
        observe_retrieval(result)

    def log_answer(self, summary: FinalSummary) -> None:
        log.info(
            "answered",
            extra={
                "request_id": self.request_id,
                "method": self.method,
                "prompt_tokens": summary.usage.prompt_tokens,
                "prefix_cache_hit_tokens": summary.usage.prefix_cache_hit_tokens,
                "completion_tokens": summary.usage.completion_tokens,
                "ttft_ms": round(summary.timings.ttft_ms, 1),
                "finish_reason": summary.finish_reason,
                "answer_cache_hit": summary.answer_cache_hit,
            },
        )
        observe_final(summary)


class RagServicer(pb_grpc.RagServiceServicer):  # type: ignore[misc]
    def __init__(self, settings: Settings, limiter: InFlightLimiter, pipeline: RagPipeline | None = None) -> None:
        # None until loading finishes: the port opens (health NOT_SERVING) before warm-up ends.
        self.pipeline = pipeline
        self._settings = settings
        self._limiter = limiter
        self._callers = CallerLimits.from_settings(settings.limits)

    def _ready(self) -> RagPipeline:
        if self.pipeline is None:
            raise Unavailable("server is still loading the index and models")
        return self.pipeline

    def _admitted(self, call: _Call, request_class: int) -> contextlib.AbstractAsyncContextManager[RequestClass]:
        return call.admitted(self._limiter, self._callers, self._settings.limits.max_call_s, request_class)

    @staticmethod
    def _deadline(budget_ms: int, call: _Call) -> Deadline:
        return Deadline(budget_ms, client_timeout_s=call.context.time_remaining(), started=call.arrived)

    async def Retrieve(self, request: pb.RetrieveRequest, context: grpc.aio.ServicerContext) -> pb.RetrieveResponse:
        call = _Call("Retrieve", context)
        async with self._admitted(call, request.request_class) as cls:
            params = validate_retrieve(
                self._settings, request.query, request.top_k, request.budget_ms, request.dedupe_documents, cls
            )
            result = await self._ready().retrieve(params, self._deadline(params.budget_ms, call))
            call.log_retrieval(result)
            return retrieve_response_pb(result)

    async def Query(self, request: pb.QueryRequest, context: grpc.aio.ServicerContext) -> None:
        # Written with context.write, not yielded: a write stuck behind a client that stopped reading
        # then runs inside the call's time cap (a yielded message is sent by grpc, outside it).
        call = _Call("Query", context)
        async with self._admitted(call, request.request_class) as cls:
            params = validate_retrieve(
                self._settings, request.query, request.top_k, request.budget_ms, request.dedupe_documents, cls
            )
            gen = validate_generate(
                self._settings,
                request.max_tokens,
                request.temperature,
                request.context_token_budget if request.HasField("context_token_budget") else None,
                cls,
            )
            deadline = self._deadline(params.budget_ms, call)
            events = self._ready().query(params, gen, deadline, call.request_id)
            try:
                async for event in events:
                    if isinstance(event, RetrievalResult):
                        call.log_retrieval(event)
                    elif isinstance(event, FinalSummary):
                        call.log_answer(event)
                    await context.write(query_event_pb(event))
            finally:
                # Now, not when garbage collected: closing the pipeline's stream aborts the engine request.
                if isinstance(events, AsyncGenerator):
                    await events.aclose()

    async def Info(self, request: pb.InfoRequest, context: grpc.aio.ServicerContext) -> pb.InfoResponse:
        call = _Call("Info", context)  # counted like every call, outside the in-flight bound
        cancelled = True
        try:
            pipeline = self._ready()
            response = info_response_pb(pipeline, self._settings.requests.retrieval_budget_ms, self._limiter.in_flight)
            cancelled = False
        except RagError as error:
            cancelled = False
            await call.fail(error)
        finally:
            call.finish(cancelled)
        return response
