"""The call gate every door's calls pass (CallGate.enter): admission (RagService calls by class and
caller, other streams by their own bound), the span, and the call's one clock. Door-neutral: the
front (server/front.py) puts the outcome, the metric and the log line around it, and each door
maps its wire to a `Door` and back."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ragserve import metrics, tracing
from ragserve.budget import Deadline, RequestContext
from ragserve.errors import DeadlineExpired
from ragserve.server.limiter import CallerLimits, InFlightLimiter
from ragserve.types import RequestClass

# rag.proto's service: every door's spans are named after its methods (tests/server/test_front.py
# checks the name against the descriptor).
SERVICE_NAME = "ragserve.v1.RagService"

_MAX_REQUEST_ID = 64


def request_id_from(given: object) -> str:
    """The caller's x-request-id when it sent a sane one, else a fresh id (the same rule on every door)."""
    if isinstance(given, str) and 0 < len(given) <= _MAX_REQUEST_ID and given.isprintable():
        return given
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
    """What a door learnt of a call before admission: its id, the class it asked for, the names the
    caller goes by (server/identity.py), the seconds its own deadline leaves (None: none) and the
    headers that may carry a trace."""

    request_id: str
    request_class: RequestClass
    caller_names: set[str]
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
    async def enter(self, method: str, door: Door, admit: bool = True, arrived: float = 0.0) -> AsyncIterator[Call]:
        """Admission, the span and the call's one clock, whichever door the call came through (gRPC
        here, HTTP in server/openai/door.py); a refusal or an expired clock raises a RagError, which
        the door turns into its own status."""
        arrived = arrived or time.monotonic()
        left = door.client_left_s
        capped = left is None or left > self._max_call_s
        ends = arrived + (self._max_call_s if left is None or capped else left)
        with contextlib.ExitStack() as held:
            held.enter_context(tracing.request_span(f"{SERVICE_NAME}/{method}", door.trace_headers))
            cls = held.enter_context(self._callers.admit(door.caller_names, door.request_class))  # at most its own
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

    @contextlib.contextmanager
    def side_stream(self) -> Iterator[None]:
        """Streams other than RagService's (health Watch, reflection) stay open as long as the caller
        likes and take no in-flight slot: they get a bound of their own (Overloaded past it)."""
        with self._side_streams.admit():
            yield
