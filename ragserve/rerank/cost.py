"""Each tier's cost at this host's load: a per-call overhead plus milliseconds per padded token.

Measured at warm-up and kept current from live batch timings. Estimates rise quickly and fall
slowly: under-estimating a batch costs the budget, over-estimating only costs a little depth.
Plans also carry a safety factor: how much slower than predicted recent batches ran, at a high
percentile. On a quiet host it is about 1; when a generator shares the cores, batch times scatter
and the planner leaves room for the scatter, not just for the average.

Both age: what no batch has confirmed for a while drifts back to the warm-up figure. Otherwise a
burst of load could raise them until no batch fits any more, and with no batch running nothing
would ever bring them down again.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

# Recent batches whose actual/predicted ratio sets the safety factor, and which percentile of them.
_SAFETY_WINDOW = 64
_SAFETY_PERCENTILE = 0.95
_SAFETY_MIN_SAMPLES = 8
# Ratios older than this no longer count; an unconfirmed per-token estimate halves its distance
# to the warm-up figure every half-life.
_SAFETY_MAX_AGE_S = 30.0
_ESTIMATE_HALF_LIFE_S = 10.0


def padded_tokens(lengths: Sequence[int]) -> int:
    """What one batch costs to run: every pair is padded to the batch's longest."""
    return len(lengths) * max(lengths) if lengths else 0


def plan_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Indexes into `lengths`, longest first, cut into batches: similar lengths pad little."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


class CostModel:
    """Predicts a batch's milliseconds from its padded token count."""

    def __init__(
        self,
        ms_per_token: float,
        overhead_ms: float = 0.0,
        rise: float = 0.5,
        fall: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if ms_per_token <= 0:
            raise ValueError("ms_per_token must be positive")
        self._lock = threading.Lock()
        self._ms_per_token = ms_per_token
        self._baseline = ms_per_token  # the warm-up figure that unconfirmed estimates return to
        self._overhead_ms = max(0.0, overhead_ms)
        self._rise = rise
        self._fall = fall
        self._clock = clock
        self._settled_at = clock()
        self._ratios: deque[tuple[float, float]] = deque(maxlen=_SAFETY_WINDOW)  # (when, actual/predicted)

    @property
    def ms_per_token(self) -> float:
        return self._ms_per_token

    @property
    def overhead_ms(self) -> float:
        return self._overhead_ms

    @classmethod
    def fit(cls, samples: Sequence[tuple[int, float]]) -> CostModel:
        """Least squares over (padded tokens, ms) samples from warm-up; needs two sizes or more."""
        n = len(samples)
        if n == 0:
            raise ValueError("no samples")
        mean_x = sum(x for x, _ in samples) / n
        mean_y = sum(y for _, y in samples) / n
        var = sum((x - mean_x) ** 2 for x, _ in samples)
        slope = sum((x - mean_x) * (y - mean_y) for x, y in samples) / var if var > 0 else 0.0
        if slope <= 0:
            # Noise swamped the size effect: charge everything per token, no fixed part.
            slope = max(y / x for x, y in samples if x > 0)
            return cls(slope, 0.0)
        return cls(slope, mean_y - slope * mean_x)

    def predict(self, tokens: int) -> float:
        return self._overhead_ms + self._ms_per_token * tokens if tokens > 0 else 0.0

    def predict_batches(self, lengths: Sequence[int], batch_size: int) -> float:
        return sum(self.predict(padded_tokens([lengths[i] for i in b])) for b in plan_batches(lengths, batch_size))

    def settle(self) -> None:
        """Let the per-token estimate drift back toward the warm-up figure for the time since the last
        settle; called before each plan. Steady live timings keep it where they put it."""
        now = self._clock()
        with self._lock:
            elapsed = now - self._settled_at
            if elapsed <= 0:
                return
            keep = 0.5 ** (elapsed / _ESTIMATE_HALF_LIFE_S)
            self._ms_per_token = self._baseline + (self._ms_per_token - self._baseline) * keep
            self._settled_at = now

    def safety(self) -> float:
        """Actual/predicted time of recent batches at the 95th percentile (nearest rank); never below 1."""
        oldest = self._clock() - _SAFETY_MAX_AGE_S
        with self._lock:
            ratios = sorted(ratio for when, ratio in self._ratios if when >= oldest)
        if len(ratios) < _SAFETY_MIN_SAMPLES:
            return 1.0
        return max(1.0, ratios[math.ceil(_SAFETY_PERCENTILE * len(ratios)) - 1])

    def observe(self, tokens: int, ms: float) -> None:
        """Fold one live batch timing into the per-token estimate and the safety factor."""
        if tokens <= 0:
            return
        predicted = self.predict(tokens)
        if predicted > 0:
            with self._lock:
                self._ratios.append((self._clock(), ms / predicted))
        sample = max(ms - self._overhead_ms, 0.0) / tokens
        if sample <= 0:
            return
        with self._lock:
            weight = self._rise if sample > self._ms_per_token else self._fall
            self._ms_per_token += weight * (sample - self._ms_per_token)
