"""A reader's cost at this host's load: a per-call overhead plus milliseconds per passage.

The reranker's cost model (rerank/cost.py) charges per padded token because its pairs vary in
length; a reader's pairs are passages of about one chunk each, padded to the batch's longest, so
the unit a caller plans with is the passage. Same approach otherwise: fitted by least squares on
timings taken at load, then kept current from live calls, rising quickly and falling slowly
(under-estimating costs the budget, over-estimating only a passage of depth).

The estimate ages as the reranker's does: what no read has confirmed for a while drifts back to
the load-time figure. One slow read (a throttled CPU) could otherwise lift it past every budget,
and with no read running nothing would ever bring it down again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

# An unconfirmed per-passage estimate halves its distance to the load-time figure every half-life.
_ESTIMATE_HALF_LIFE_S = 10.0


@dataclass(frozen=True, slots=True)
class CostSample:
    passages: int
    ms: float


class ReadCost:
    """Predicts one `read` call's milliseconds from how many passages it is given."""

    def __init__(
        self,
        ms_per_passage: float,
        overhead_ms: float = 0.0,
        rise: float = 0.5,
        fall: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if ms_per_passage <= 0:
            raise ValueError("ms_per_passage must be positive")
        self._lock = threading.Lock()
        self._ms_per_passage = ms_per_passage
        self._baseline = ms_per_passage  # the load-time figure that unconfirmed estimates return to
        self._overhead_ms = max(0.0, overhead_ms)
        self._rise = rise
        self._fall = fall
        self._clock = clock
        self._settled_at = clock()

    @classmethod
    def fit(cls, samples: Sequence[CostSample], clock: Callable[[], float] = time.monotonic) -> ReadCost:
        """Least squares over load-time samples of two batch sizes or more."""
        if not samples:
            raise ValueError("no samples")
        n = len(samples)
        mean_x = sum(s.passages for s in samples) / n
        mean_y = sum(s.ms for s in samples) / n
        var = sum((s.passages - mean_x) ** 2 for s in samples)
        slope = sum((s.passages - mean_x) * (s.ms - mean_y) for s in samples) / var if var > 0 else 0.0
        if slope <= 0:
            # Noise swamped the size effect: charge everything per passage.
            return cls(max(s.ms / s.passages for s in samples if s.passages > 0), 0.0, clock=clock)
        return cls(slope, mean_y - slope * mean_x, clock=clock)

    @property
    def ms_per_passage(self) -> float:
        self._settle()
        return self._ms_per_passage

    @property
    def overhead_ms(self) -> float:
        return self._overhead_ms

    def predict(self, passages: int) -> float:
        """Milliseconds one `read` of `passages` passages is expected to take (0 for none)."""
        return self._overhead_ms + self.ms_per_passage * passages if passages > 0 else 0.0

    def passages_within(self, budget_ms: float) -> int:
        """The most passages one `read` is expected to finish within `budget_ms` (may be 0)."""
        room = budget_ms - self._overhead_ms
        return max(0, int(room // self.ms_per_passage)) if room > 0 else 0

    def _settle(self) -> None:
        """Let the estimate drift back toward the load-time figure for the time since the last settle."""
        now = self._clock()
        with self._lock:
            elapsed = now - self._settled_at
            if elapsed <= 0:
                return
            keep = 0.5 ** (elapsed / _ESTIMATE_HALF_LIFE_S)
            self._ms_per_passage = self._baseline + (self._ms_per_passage - self._baseline) * keep
            self._settled_at = now

    def observe(self, passages: int, ms: float) -> None:
        """Fold one live call's timing into the per-passage estimate."""
        if passages <= 0:
            return
        sample = max(ms - self._overhead_ms, 0.0) / passages
        if sample <= 0:
            return
        self._settle()
        with self._lock:
            weight = self._rise if sample > self._ms_per_passage else self._fall
            self._ms_per_passage += weight * (sample - self._ms_per_passage)
