"""One Deadline per request: the retrieval budget and the client's deadline, in one object."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from typing import Any

from ragserve import tracing
from ragserve.types import RequestClass, StageTimings


class Deadline:
    """Tracks the retrieval+rerank budget and the caller's overall deadline.

    Every stage asks it how much time is left instead of keeping its own timeout, and every
    cumulative timing (retrieval total, TTFT, total) counts from its one start: the moment the call
    arrived (`started`, a reading of `clock`), before validation and admission.
    `clock` returns seconds (monotonic); tests pass a fake clock.
    """

    __slots__ = ("_budget_end", "_client_end", "_clock", "_start")

    def __init__(
        self,
        budget_ms: float,
        client_timeout_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        started: float | None = None,
    ) -> None:
        self._clock = clock
        now = clock()
        self._start = now if started is None else started
        self._budget_end = self._start + budget_ms / 1000.0
        # `client_timeout_s` is what the caller has left now (not at `started`).
        self._client_end = None if client_timeout_s is None else now + client_timeout_s

    def elapsed_ms(self) -> float:
        return (self._clock() - self._start) * 1000.0

    def budget_left_ms(self) -> float:
        """Time left for retrieval+rerank, never beyond the client's deadline."""
        end = self._budget_end
        if self._client_end is not None:
            end = min(end, self._client_end)
        return max(0.0, (end - self._clock()) * 1000.0)

    def client_left_s(self) -> float | None:
        """Seconds until the caller's deadline, or None when the caller set none."""
        if self._client_end is None:
            return None
        return max(0.0, self._client_end - self._clock())

    def client_end(self, loop: asyncio.AbstractEventLoop) -> float | None:
        """The caller's deadline as an absolute time on `loop`'s clock (for asyncio.timeout_at), or
        None. Fixed once taken: time the request spends waiting on its consumer counts against it."""
        left = self.client_left_s()
        return None if left is None else loop.time() + left

    def client_expired(self) -> bool:
        return self._client_end is not None and self._clock() >= self._client_end

    def budget_exhausted(self) -> bool:
        return self.budget_left_ms() <= 0.0


@dataclass(frozen=True, slots=True)
class RequestContext:
    """One request's facts, decided once at the door and handed down: its one clock, its id (logs
    and traces only) and who waits for it (admission, the model threads' order, the engine's
    priority, warming's pause)."""

    deadline: Deadline
    request_id: str = ""
    request_class: RequestClass = RequestClass.INTERACTIVE
    # Each stage adds its own time here once (`stage`); the retrieval event carries a snapshot,
    # the final summary and the log line read the rest.
    timings: StageTimings = field(default_factory=StageTimings)

    @property
    def interactive(self) -> bool:
        return self.request_class is RequestClass.INTERACTIVE

    def stage(self, name: str, into: str = "") -> StageTimer:
        """Times one stage and adds it to `timings.<into or name>_ms` (two cache lookups add up)."""
        attr = f"{into or name}_ms"

        def add(ms: float) -> None:
            setattr(self.timings, attr, getattr(self.timings, attr) + ms)

        return StageTimer(name, on_done=add)

    def timings_so_far(self) -> StageTimings:
        """A copy: what an event already sent reports must not change as later stages record."""
        return replace(self.timings)


class StageTimer:
    """Context manager that measures one stage once, in milliseconds.

    A named stage is also a tracing span when tracing is on (the same start and end).
    """

    __slots__ = ("_clock", "_on_done", "_span", "_t0", "ms", "name")

    def __init__(
        self,
        name: str = "",
        clock: Callable[[], float] = time.perf_counter,
        on_done: Callable[[float], None] | None = None,
    ) -> None:
        self.name = name
        self._clock = clock
        self._on_done = on_done
        self._span: AbstractContextManager[Any] | None = None
        self._t0 = 0.0
        self.ms = 0.0

    def __enter__(self) -> StageTimer:
        if self.name and tracing.enabled():
            self._span = tracing.stage_span(self.name)
            self._span.__enter__()
        self._t0 = self._clock()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.ms = (self._clock() - self._t0) * 1000.0
        if self._on_done is not None:
            self._on_done(self.ms)
        if self._span is not None:
            self._span.__exit__(*exc)
            self._span = None
