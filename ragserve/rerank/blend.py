"""How a tuned cross-encoder's score and the fused retrieval score combine into the final order.

One function, used by the tuner when it fits the weight and by the server when it reranks, so
the order served is the order that was measured: `fused + ce_weight * logit`, the fused scores
min-max normalized over all candidates handed to the reranker (0..1 whatever the fusion method).
The cross-encoder's raw logit is used, not a per-request normalization of it: two pairs then keep
their relative order whatever else was scored, so a budget-cut depth reorders its prefix exactly as
the full depth would order those pairs (min-max over the scored pairs turns any two of them into 0
and 1, and a sigmoid saturates on logits of 15 or more). A constant offset in the logits changes
nothing (only scored pairs are compared with each other). `ce_weight` 0 is the fused order; large
weights approach the cross-encoder's own order. Only the scored prefix is reordered: the rest
stays in fused order.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

Scores = Sequence[float] | np.ndarray


def normalized_fused(fused: Scores) -> np.ndarray:
    """Min-max over the candidate list (all equal: all 1)."""
    values = np.asarray(fused, dtype=np.float64)
    if values.size == 0:
        return values
    lo, hi = float(values.min()), float(values.max())
    if hi - lo <= 1e-12:
        return np.ones_like(values)
    return (values - lo) / (hi - lo)


def blend(ce_logits: Scores, fused_normalized: Scores, ce_weight: float) -> np.ndarray:
    """The final score of each scored candidate (ce_logits[i] belongs to fused_normalized[i])."""
    ce = np.asarray(ce_logits, dtype=np.float64)
    fused = np.asarray(fused_normalized, dtype=np.float64)[: ce.size]
    return fused + ce_weight * ce


def blended_order(ce_logits: Scores, fused: Scores, ce_weight: float) -> list[int]:
    """Candidate positions in their final order: the first len(ce_logits) by blended score (ties
    keep the fused order), then the unscored rest as they were."""
    depth = len(ce_logits)
    scores = blend(ce_logits, normalized_fused(fused), ce_weight)
    head = sorted(range(depth), key=lambda i: (-scores[i], i))
    return head + list(range(depth, len(fused)))
