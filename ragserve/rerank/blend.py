"""How a tuned cross-encoder's score and the fused retrieval score combine into the final order.

One function, used by the tuner when it fits the weight and by the server when it reranks, so
the order served is the order that was measured. The cross-encoder scores are min-max normalized
over the pairs it scored and the fused scores over all candidates handed to the reranker, so both
sit in 0..1 whatever the fusion method or the model's logit scale (a sigmoid saturates on a model
whose logits run to 15 or more, and the blend would then add a constant); `ce_weight` 0 is the fused
order, 1 the cross-encoder's.
Only the scored prefix is reordered: a budget-cut depth leaves the rest in fused order.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

Scores = Sequence[float] | np.ndarray


def normalized_fused(fused: Scores) -> np.ndarray:
    """Min-max over the candidate list (all equal: all 1)."""
    return _minmax(fused)


def _minmax(scores: Scores) -> np.ndarray:
    values = np.asarray(scores, dtype=np.float64)
    if values.size == 0:
        return values
    lo, hi = float(values.min()), float(values.max())
    if hi - lo <= 1e-12:
        return np.ones_like(values)
    return (values - lo) / (hi - lo)


def blend(ce_logits: Scores, fused_normalized: Scores, ce_weight: float) -> np.ndarray:
    """The final score of each scored candidate (ce_logits[i] belongs to fused_normalized[i])."""
    ce = _minmax(ce_logits)
    fused = np.asarray(fused_normalized, dtype=np.float64)[: ce.size]
    return ce_weight * ce + (1.0 - ce_weight) * fused


def blended_order(ce_logits: Scores, fused: Scores, ce_weight: float) -> list[int]:
    """Candidate positions in their final order: the first len(ce_logits) by blended score (ties
    keep the fused order), then the unscored rest as they were."""
    depth = len(ce_logits)
    scores = blend(ce_logits, normalized_fused(fused), ce_weight)
    head = sorted(range(depth), key=lambda i: (-scores[i], i))
    return head + list(range(depth, len(fused)))
