"""Each tier's cost at this host's load: a per-call overhead plus milliseconds per padded token,
the shared cost model (ragserve/cost.py) counted in padded tokens, with how a tier's pairs are cut
into batches. Plans carry its safety factor: how much slower than predicted recent batches ran."""

from __future__ import annotations

from collections.abc import Sequence

from ragserve.cost import LinearCost


def padded_tokens(lengths: Sequence[int]) -> int:
    """What one batch costs to run: every pair is padded to the batch's longest."""
    return len(lengths) * max(lengths) if lengths else 0


def plan_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Indexes into `lengths`, longest first, cut into batches: similar lengths pad little."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


class CostModel(LinearCost):
    """Predicts a batch's milliseconds from its padded token count."""

    @property
    def ms_per_token(self) -> float:
        return self.ms_per_unit

    def predict_batches(self, lengths: Sequence[int], batch_size: int) -> float:
        return sum(self.predict(padded_tokens([lengths[i] for i in b])) for b in plan_batches(lengths, batch_size))
