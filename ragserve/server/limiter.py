"""A bound on requests in flight: beyond it, fail fast instead of queueing without limit.

Batch requests get at most a share of the slots and never the last ones interactive callers need,
so under overload batch is refused first and a person is never refused because a job is running.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from ragserve import metrics
from ragserve.config import LimitsSettings, default_of, parse_caller_limits
from ragserve.errors import Overloaded
from ragserve.types import RequestClass


class InFlightLimiter:
    """Counts admitted requests by class; `admit()` raises Overloaded at once past the bounds.

    Used from one event loop only, so plain counters are enough (no await between check and add).
    """

    def __init__(
        self,
        max_in_flight: int,
        retry_after_ms: int = default_of(LimitsSettings, "overload_retry_after_ms"),
        batch_max_share: float = default_of(LimitsSettings, "batch_max_share"),
        interactive_reserved: int = default_of(LimitsSettings, "interactive_reserved"),
    ) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")
        self.max_in_flight = max_in_flight
        self.retry_after_ms = retry_after_ms
        # At least one batch slot, and never more than the slots interactive does not keep.
        self.batch_max = max(1, min(int(max_in_flight * batch_max_share), max_in_flight - interactive_reserved))
        self.in_flight = 0
        self.batch_in_flight = 0

    @classmethod
    def from_settings(cls, limits: LimitsSettings) -> InFlightLimiter:
        return cls(
            limits.max_in_flight, limits.overload_retry_after_ms, limits.batch_max_share, limits.interactive_reserved
        )

    @contextmanager
    def admit(self, request_class: RequestClass = RequestClass.INTERACTIVE) -> Iterator[None]:
        batch = request_class is RequestClass.BATCH
        if self.in_flight >= self.max_in_flight:
            self._shed(request_class, f"{self.in_flight} requests in flight (limit {self.max_in_flight})")
        if batch and self.batch_in_flight >= self.batch_max:
            self._shed(
                request_class,
                f"{self.batch_in_flight} batch requests in flight (batch limit {self.batch_max}: "
                "RAGSERVE_BATCH_MAX_SHARE, RAGSERVE_INTERACTIVE_RESERVED)",
            )
        self.in_flight += 1
        self.batch_in_flight += batch
        try:
            yield
        finally:
            self.in_flight -= 1
            self.batch_in_flight -= batch

    def _shed(self, request_class: RequestClass, message: str) -> None:
        metrics.SHED.labels(request_class.value).inc()
        raise Overloaded(message, self.retry_after_ms)


class CallerLimits:
    """RAGSERVE_CALLER_LIMITS: the highest class each named caller may use and its calls in flight.
    A caller is named by its mTLS client certificate (its CN or any SAN); `*` stands for every caller
    no pair names, and they all share its one cap. A certificate whose names match several pairs
    gets the most restrictive (batch before interactive, then the smallest cap): adding a name to
    a certificate never loosens its limits."""

    def __init__(self, limits: dict[str, tuple[str, int]], retry_after_ms: int) -> None:
        self._limits = {name: (RequestClass(level), cap) for name, (level, cap) in limits.items()}
        self._retry_after_ms = retry_after_ms
        self._in_flight: Counter[str] = Counter()

    @classmethod
    def from_settings(cls, limits: LimitsSettings) -> CallerLimits:
        return cls(parse_caller_limits(limits.caller_limits), limits.overload_retry_after_ms)

    def _rule_of(self, names: set[str]) -> str | None:
        named = [name for name in names if name in self._limits]
        if named:
            return min(named, key=self._restrictiveness)
        return "*" if "*" in self._limits else None

    def _restrictiveness(self, name: str) -> tuple[int, int, str]:
        level, cap = self._limits[name]
        return (0 if level is RequestClass.BATCH else 1, cap, name)

    @contextmanager
    def admit(self, names: set[str], asked: RequestClass) -> Iterator[RequestClass]:
        """The class the call runs at (at most the caller's own); Overloaded past its cap."""
        rule = self._rule_of(names)
        if rule is None:
            yield asked
            return
        ceiling, cap = self._limits[rule]
        granted = RequestClass.BATCH if RequestClass.BATCH in (ceiling, asked) else RequestClass.INTERACTIVE
        if self._in_flight[rule] >= cap:
            metrics.SHED.labels(granted.value).inc()
            raise Overloaded(
                f"caller {rule!r} has {self._in_flight[rule]} calls in flight (its limit: RAGSERVE_CALLER_LIMITS)",
                self._retry_after_ms,
            )
        self._in_flight[rule] += 1
        try:
            yield granted
        finally:
            self._in_flight[rule] -= 1
