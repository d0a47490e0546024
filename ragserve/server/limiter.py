"""A bound on requests in flight: beyond it, fail fast instead of queueing without limit."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ragserve.config import LimitsSettings, default_of
from ragserve.errors import Overloaded


class InFlightLimiter:
    """Counts admitted requests; `admit()` raises Overloaded at once when the bound is reached.

    Used from one event loop only, so a plain counter is enough (no await between check and add).
    """

    def __init__(
        self, max_in_flight: int, retry_after_ms: int = default_of(LimitsSettings, "overload_retry_after_ms")
    ) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")
        self.max_in_flight = max_in_flight
        self.retry_after_ms = retry_after_ms
        self.in_flight = 0

    @contextmanager
    def admit(self) -> Iterator[None]:
        if self.in_flight >= self.max_in_flight:
            raise Overloaded(f"{self.in_flight} requests in flight (limit {self.max_in_flight})", self.retry_after_ms)
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1
