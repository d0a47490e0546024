"""A circuit breaker for the cache store: stop paying timeouts for a backend that is down.

closed: every request uses the store. After `failure_threshold` consecutive failures it opens:
requests skip the store (a plain miss, zero added latency). Once `cooldown_s` has passed, one
background probe (PING) runs; while it runs the breaker is half-open and requests still skip the
store. A successful probe closes it; a failed one opens it for another cool-down.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import Enum

from ragserve.config import CacheSettings, default_of


class BreakerState(Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    def __init__(
        self,
        failure_threshold: int = default_of(CacheSettings, "breaker_failures"),
        cooldown_s: float = default_of(CacheSettings, "breaker_cooldown_s"),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if failure_threshold < 1 or cooldown_s < 0:
            raise ValueError("failure_threshold must be >= 1 and cooldown_s >= 0")
        self.failure_threshold = failure_threshold
        self.cooldown_s = cooldown_s
        self._clock = clock
        self.state = BreakerState.CLOSED
        self._failures = 0
        self._opened_at = 0.0

    def allow(self) -> bool:
        """True when a request may use the store now."""
        return self.state is BreakerState.CLOSED

    def probe_due(self) -> bool:
        """True once per cool-down: the caller should start a probe and report its outcome."""
        if self.state is BreakerState.OPEN and self._clock() - self._opened_at >= self.cooldown_s:
            self.state = BreakerState.HALF_OPEN
            return True
        return False

    def record_success(self) -> None:
        self._failures = 0
        self.state = BreakerState.CLOSED

    def record_failure(self) -> None:
        """A request's or a probe's failure. A failed probe reopens at once."""
        self._failures += 1
        if self.state is BreakerState.HALF_OPEN or self._failures >= self.failure_threshold:
            self.state = BreakerState.OPEN
            self._opened_at = self._clock()

    def trip(self) -> None:
        """Open now (e.g. the store could not be reached at start-up)."""
        self._failures = self.failure_threshold
        self.state = BreakerState.OPEN
        self._opened_at = self._clock()
