"""One cost model for the model calls a budget plans (the reranker's batches, the reader's reads): a
per-call overhead plus milliseconds per unit (a padded token, a passage), at this host's load.

Fitted by least squares on timings taken at load, then kept current from live calls, rising quickly
and falling slowly: under-estimating costs the budget, over-estimating only a little depth. What no
call has confirmed for a while drifts back to the load-time figure: one slow call (a throttled CPU)
could otherwise lift it past every budget, and with no call running nothing would bring it down.

A safety factor says how much slower than predicted recent calls ran, at a high percentile: about 1
on a quiet host; when a generator shares the cores, times scatter and a plan leaves room for it.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Self

# An unconfirmed per-unit estimate halves its distance to the load-time figure every half-life.
ESTIMATE_HALF_LIFE_S = 10.0
# Recent calls whose actual/predicted ratio sets the safety factor, which percentile of them, and
# how old a ratio may be and still count.
_SAFETY_WINDOW = 64
_SAFETY_PERCENTILE = 0.95
_SAFETY_MIN_SAMPLES = 8
_SAFETY_MAX_AGE_S = 30.0


class LinearCost:
    """Predicts one call's milliseconds from its units."""

    def __init__(
        self,
        ms_per_unit: float,
        overhead_ms: float = 0.0,
        rise: float = 0.5,
        fall: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if ms_per_unit <= 0:
            raise ValueError("the cost per unit must be positive")
        self._lock = threading.Lock()
        self._ms_per_unit = ms_per_unit
        self._baseline = ms_per_unit  # the load-time figure that unconfirmed estimates return to
        self._overhead_ms = max(0.0, overhead_ms)
        self._rise = rise
        self._fall = fall
        self._clock = clock
        self._settled_at = clock()
        self._ratios: deque[tuple[float, float]] = deque(maxlen=_SAFETY_WINDOW)  # (when, actual/predicted)

    @classmethod
    def fit(cls, samples: Sequence[tuple[int, float]], clock: Callable[[], float] = time.monotonic) -> Self:
        """Least squares over (units, ms) samples of two sizes or more."""
        n = len(samples)
        if n == 0:
            raise ValueError("no samples")
        mean_x = sum(x for x, _ in samples) / n
        mean_y = sum(y for _, y in samples) / n
        var = sum((x - mean_x) ** 2 for x, _ in samples)
        slope = sum((x - mean_x) * (y - mean_y) for x, y in samples) / var if var > 0 else 0.0
        if slope <= 0:
            # Noise swamped the size effect: charge everything per unit, no fixed part.
            return cls(max(y / x for x, y in samples if x > 0), 0.0, clock=clock)
        return cls(slope, mean_y - slope * mean_x, clock=clock)

    @property
    def ms_per_unit(self) -> float:
        return self._ms_per_unit

    @property
    def overhead_ms(self) -> float:
        return self._overhead_ms

    def predict(self, units: int) -> float:
        """Milliseconds one call of `units` units is expected to take (0 for none)."""
        return self._overhead_ms + self._ms_per_unit * units if units > 0 else 0.0

    def units_within(self, budget_ms: float) -> int:
        """The most units one call is expected to finish within `budget_ms` (may be 0)."""
        room = budget_ms - self._overhead_ms
        return max(0, int(room // self._ms_per_unit)) if room > 0 else 0

    def settle(self) -> None:
        """Let the estimate drift back toward the load-time figure for the time since the last
        settle; called before each plan. Steady live timings keep it where they put it."""
        now = self._clock()
        with self._lock:
            elapsed = now - self._settled_at
            if elapsed <= 0:
                return
            keep = 0.5 ** (elapsed / ESTIMATE_HALF_LIFE_S)
            self._ms_per_unit = self._baseline + (self._ms_per_unit - self._baseline) * keep
            self._settled_at = now

    def safety(self) -> float:
        """Actual/predicted time of recent calls at the 95th percentile (nearest rank); never below 1."""
        oldest = self._clock() - _SAFETY_MAX_AGE_S
        with self._lock:
            ratios = sorted(ratio for when, ratio in self._ratios if when >= oldest)
        if len(ratios) < _SAFETY_MIN_SAMPLES:
            return 1.0
        return max(1.0, ratios[math.ceil(_SAFETY_PERCENTILE * len(ratios)) - 1])

    def observe(self, units: int, ms: float) -> None:
        """Fold one live call's timing into the per-unit estimate and the safety factor."""
        if units <= 0:
            return
        predicted = self.predict(units)
        if predicted > 0:
            with self._lock:
                self._ratios.append((self._clock(), ms / predicted))
        sample = max(ms - self._overhead_ms, 0.0) / units
        if sample <= 0:
            return
        with self._lock:
            weight = self._rise if sample > self._ms_per_unit else self._fall
            self._ms_per_unit += weight * (sample - self._ms_per_unit)
