"""The one front door every call passes (CallGate): the request id and class, admission (RagService
calls by class, other streams by their own bound), the span, the call's one clock, the status for
whatever the call raises, the final log line and the status metric. A servicer method is left with
convert -> pipeline -> convert."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from ragserve import metrics, tracing
from ragserve.budget import Deadline, RequestContext
from ragserve.errors import DeadlineExpired, Overloaded, RagError
from ragserve.server.auth import client_ids
from ragserve.server.limiter import CallerLimits, InFlightLimiter
from ragserve.server.observability import observe_final, observe_request, observe_retrieval
from ragserve.server.status import to_status
from ragserve.server.validation import validate_request_class
from ragserve.types import FinalSummary, RequestClass, RetrievalResult
from ragserve.v1 import rag_pb2 as pb

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


@dataclass(frozen=True)
class Call:
    """What the door learnt of one call. `arrived` and `ends` are readings of time.monotonic: the
    call's one start (stage totals, TTFT and its duration count from it) and its one end, the
    earlier of the client's deadline and RAGSERVE_MAX_CALL_S."""

    request_id: str
    method: str
    request_class: RequestClass
    arrived: float
    ends: float
    capped: bool  # the server's cap, not the client's deadline, sets `ends`

    def request(self, budget_ms: float) -> RequestContext:
        """The value the core gets: the call's clock with its retrieval budget, its id and class."""
        deadline = Deadline(budget_ms, client_timeout_s=self.ends - time.monotonic(), started=self.arrived)
        return RequestContext(deadline, self.request_id, self.request_class)

    def elapsed_ms(self) -> float:
        return (time.monotonic() - self.arrived) * 1000.0


@dataclass(frozen=True)
class Door:
    """What a door (gRPC or HTTP) learnt of a call before admission: its id, the class it asked
    for, the caller's verified certificate names, the seconds its own deadline leaves (None: none)
    and the headers that may carry a trace."""

    request_id: str
    request_class: RequestClass
    client_ids: set[str]
    client_left_s: float | None
    trace_headers: Sequence[tuple[str, Any]] | None


class CallGate:
    def __init__(
        self, limiter: InFlightLimiter, side_streams: InFlightLimiter, callers: CallerLimits, max_call_s: float
    ) -> None:
        self._limiter = limiter
        self._side_streams = side_streams
        self._callers = callers
        self._max_call_s = max_call_s

    @property
    def in_flight(self) -> int:
        return self._limiter.in_flight

    @contextlib.asynccontextmanager
    async def call(
        self, method: str, context: grpc.aio.ServicerContext, request_class: int = 0, admit: bool = True
    ) -> AsyncIterator[Call]:
        """A RagService call, from arrival to its status. `admit`: it takes an in-flight slot (Info,
        answered from memory, takes none).

        Past the call's end the body is cancelled wherever it waits (the engine, or a write to a
        client that stopped reading), and the slot is freed before the DEADLINE_EXCEEDED status is
        queued behind any unread messages. A cancelled call (client gone) ends in CancelledError, a
        BaseException: it passes through untouched and is counted as CANCELLED.
        """
        arrived = time.monotonic()
        request_id = request_id_of(context)
        code = "CANCELLED"
        try:
            asked = validate_request_class(request_class)  # admission depends on it: checked first
            door = Door(request_id, asked, client_ids(context), context.time_remaining(), context.invocation_metadata())
            async with self.enter(method, door, admit, arrived) as call:
                yield call
            code = "OK"
        except RagError as error:
            status = to_status(error)
            code = status.code.name
            log.info(
                "request failed",
                extra={"request_id": request_id, "method": method, "code": code, "error": type(error).__name__},
            )
            await context.abort_with_status(status)
        except grpc.aio.AbortError:
            code = "UNKNOWN"  # the status was sent by whoever aborted
            raise
        except Exception:
            # A bug, not a caller's mistake: logged with its traceback here, no internals to the caller.
            code = "INTERNAL"
            log.exception("request crashed", extra={"request_id": request_id, "method": method})
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error (request id {request_id})")
        finally:
            observe_request(method, code, (time.monotonic() - arrived) * 1000.0)

    @contextlib.asynccontextmanager
    async def enter(self, method: str, door: Door, admit: bool = True, arrived: float = 0.0) -> AsyncIterator[Call]:
        """Admission, the span and the call's one clock, whichever door the call came through (gRPC
        here, HTTP in server/openai_http.py); a refusal or an expired clock raises a RagError, which
        the door turns into its own status."""
        arrived = arrived or time.monotonic()
        left = door.client_left_s
        capped = left is None or left > self._max_call_s
        ends = arrived + (self._max_call_s if left is None or capped else left)
        with contextlib.ExitStack() as held:
            held.enter_context(tracing.request_span(f"{SERVICE_NAME}/{method}", door.trace_headers))
            cls = held.enter_context(self._callers.admit(door.client_ids, door.request_class))  # at most its own
            if admit:
                held.enter_context(self._limiter.admit(cls))
                metrics.IN_FLIGHT.inc()
                held.callback(metrics.IN_FLIGHT.dec)
            call = Call(door.request_id, method, cls, arrived, ends, capped)
            loop = asyncio.get_running_loop()
            clock = asyncio.timeout_at(loop.time() + (ends - time.monotonic()))
            try:
                async with clock:
                    yield call
            except TimeoutError as exc:
                if not clock.expired():
                    raise
                raise self._expired(call) from exc
            except DeadlineExpired as exc:  # a stage saw the same end first
                if not capped:
                    raise
                raise self._expired(call) from exc

    def _expired(self, call: Call) -> DeadlineExpired:
        if call.capped:
            return DeadlineExpired(
                f"the call ran longer than the server allows ({self._max_call_s:g} s, RAGSERVE_MAX_CALL_S)"
            )
        return DeadlineExpired("the client's deadline passed")

    @contextlib.asynccontextmanager
    async def side_stream(self, context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
        """Streams other than Query (health Watch, reflection) stay open as long as the caller likes
        and take no in-flight slot: they get a bound of their own, so they cannot pile up."""
        with contextlib.ExitStack() as slot:
            try:
                slot.enter_context(self._side_streams.admit())
            except Overloaded as error:
                await context.abort_with_status(to_status(error))
            yield


def log_retrieval(call: Call, result: RetrievalResult) -> None:
    # Ids and sizes only: document text and the question never reach the logs.
    log.info(
        "retrieved",
        extra={
            "request_id": call.request_id,
            "method": call.method,
            "doc_ids": [p.chunk.doc_id for p in result.passages],
            "passage_chars": [len(p.chunk.text) for p in result.passages],
            "retrieval_ms": round(result.timings.retrieval_total_ms, 2),
            "cache_hit": result.cache_hit,
        },
    )
    observe_retrieval(result)


def log_answer(call: Call, summary: FinalSummary) -> None:
    log.info(
        "answered",
        extra={
            "request_id": call.request_id,
            "method": call.method,
            "prompt_tokens": summary.usage.prompt_tokens,
            "prefix_cache_hit_tokens": summary.usage.prefix_cache_hit_tokens,
            "completion_tokens": summary.usage.completion_tokens,
            "ttft_ms": round(summary.timings.ttft_ms, 1),
            "finish_reason": summary.finish_reason,
            "answer_cache_hit": summary.answer_cache_hit,
        },
    )
    observe_final(summary)
