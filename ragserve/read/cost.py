"""A reader's cost at this host's load: a per-call overhead plus milliseconds per passage, the
shared cost model (ragserve/cost.py) counted in passages. A reader's pairs are passages of about
one chunk each, padded to the batch's longest, so the unit a caller plans with is the passage (the
reranker's pairs vary in length: it counts padded tokens, rerank/cost.py). The estimate settles
toward its load-time figure whenever it is read."""

from __future__ import annotations

from typing import NamedTuple

from ragserve.cost import LinearCost


class CostSample(NamedTuple):
    """One load-time read: (passages, ms), the (units, ms) the cost model fits."""

    passages: int
    ms: float


class ReadCost(LinearCost):
    """Predicts one `read` call's milliseconds from how many passages it is given."""

    @property
    def ms_per_passage(self) -> float:
        self.settle()
        return self.ms_per_unit

    def predict(self, units: int) -> float:
        self.settle()
        return super().predict(units)

    def passages_within(self, budget_ms: float) -> int:
        """The most passages one `read` is expected to finish within `budget_ms` (may be 0)."""
        self.settle()
        return self.units_within(budget_ms)

    def observe(self, units: int, ms: float) -> None:
        self.settle()
        super().observe(units, ms)
