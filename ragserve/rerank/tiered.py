"""The budgeted reranker: tier 1 over the fused candidates, tier 2 over tier 1's best.

Depth comes from the time the request's Deadline has left and each tier's measured cost. When
time is short, tier 2 scores fewer pairs or is skipped first, then tier 1; with no time the fused
order is served, flagged. Before every batch the prediction is checked against the time left, so
a tier that turns slow overruns the budget by at most the batch already running.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from ragserve.budget import Deadline
from ragserve.config import RerankSettings, default_of
from ragserve.rerank.base import CrossEncoder, EncodedPair, RerankOutcome
from ragserve.rerank.blend import blend, normalized_fused
from ragserve.rerank.cost import CostModel, padded_tokens, plan_batches
from ragserve.types import Passage, model_name

log = logging.getLogger(__name__)

DepthPolicy = Literal["budget", "fixed"]
_DEFAULT_POLICY: DepthPolicy = default_of(RerankSettings, "depth_policy")

# Reordering fewer than two pairs changes nothing.
MIN_DEPTH = 2
_WARM_TEXT = (
    "Cross-encoders read the query and the passage together, so every pair costs a full forward pass "
    "through the transformer, and the cost grows with the number of tokens in the batch. "
)


@dataclass(slots=True)
class Tier:
    """One cross-encoder and its limits; `cost` is measured at warm-up (or given, in tests).

    With `ce_weight`, the tier orders what it scored by the blend of its score and the fused score
    (rerank/blend.py, the weight a tuned version ships) instead of its score alone."""

    name: str
    encoder: CrossEncoder
    max_depth: int
    batch_size: int
    cost: CostModel | None = None
    ce_weight: float | None = None

    def measure(self, max_seq_len: int, repeats: int = 3) -> CostModel:
        """Time batches of a few shapes at this host's load and fit overhead + ms per token."""
        shapes = [(1, max(16, max_seq_len // 4)), (max(2, self.batch_size // 2), max_seq_len // 2)]
        shapes.append((self.batch_size, max_seq_len))
        samples: list[tuple[int, float]] = []
        self.encoder.score(self.encoder.encode("warm-up", [_WARM_TEXT]))  # first pass allocates
        for pairs, tokens in shapes:
            text = " ".join((_WARM_TEXT * (1 + tokens // 30)).split()[: max(1, tokens - 16)])
            encoded = self.encoder.encode("how much does a cross-encoder cost per token", [text] * pairs)
            width = padded_tokens([len(p) for p in encoded])
            runs = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                self.encoder.score(encoded)
                runs.append((time.perf_counter() - t0) * 1000.0)
            samples.append((width, statistics.median(runs)))
        self.cost = CostModel.fit(samples)
        log.info(
            "%s %s (%s): %.1f ms per call + %.4f ms per token, from %s",
            self.name,
            self.encoder.model_id,
            self.encoder.backend,
            self.cost.overhead_ms,
            self.cost.ms_per_token,
            ", ".join(f"{x} tok {y:.1f} ms" for x, y in samples),
        )
        return self.cost


def _order(scores: dict[int, float], size: int) -> list[int]:
    """The source position of each slot: scored items take the slots they held, best score first
    (ties keep their order); unscored items keep their place."""
    slots = sorted(scores)
    order = list(range(size))
    for slot, src in zip(slots, sorted(slots, key=lambda i: (-scores[i], i)), strict=True):
        order[slot] = src
    return order


def _blended(scores: dict[int, float], fused: Sequence[float], ce_weight: float) -> dict[int, float]:
    """Each scored position's blend of its cross-encoder score and its normalized fused score.

    On a scored prefix, ordering by these is `blended_order`; a batch cut mid-way can leave scored
    positions that are not a prefix, so the blend is taken position by position."""
    slots = sorted(scores)
    values = blend([scores[i] for i in slots], [fused[i] for i in slots], ce_weight)
    return dict(zip(slots, (float(v) for v in values), strict=True))


class TieredReranker:
    """One or two cross-encoder tiers under the request's Deadline (or at fixed depths, for comparison)."""

    def __init__(
        self,
        tiers: Sequence[Tier],
        candidates: int,
        policy: DepthPolicy = _DEFAULT_POLICY,
        *,
        reserve_ms: float,
        max_seq_len: int = default_of(RerankSettings, "max_seq_len"),
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        if not 1 <= len(tiers) <= 2:
            raise ValueError("one or two tiers")
        self._tiers = list(tiers)
        self._candidates = candidates
        self._policy = policy
        self._reserve_ms = reserve_ms
        self._max_seq_len = max_seq_len
        self._timer = timer  # seconds; tests drive a simulated clock

    @property
    def candidates(self) -> int:
        return self._candidates

    @property
    def tiers(self) -> list[Tier]:
        return list(self._tiers)

    def describe(self) -> list[str]:
        out = []
        for tier in self._tiers:
            model = model_name(tier.encoder.model_id)  # Info shows this: no server paths
            label = f"{tier.name} {model} {tier.encoder.backend} max_depth={tier.max_depth}"
            if tier.ce_weight is not None:
                label += f" ce_weight={tier.ce_weight:g}"
            if self._policy == "fixed":
                label += " fixed-depth"
            if tier.encoder.random_head:
                label += " RANDOM-HEAD TEST MODEL (scores are not relevance)"
            out.append(label)
        return out

    def warm_up(self) -> None:
        for tier in self._tiers:
            if tier.cost is None:
                tier.measure(self._max_seq_len)

    def _time_left(self, deadline: Deadline) -> float:
        if self._policy == "fixed":
            return math.inf
        return deadline.budget_left_ms() - self._reserve_ms

    @staticmethod
    def _cost(tier: Tier) -> CostModel:
        if tier.cost is None:
            raise RuntimeError(f"{tier.name} has no cost estimate: call warm_up() first")
        return tier.cost

    def _plan(self, tier: Tier, lengths: Sequence[int], time_ms: float) -> int:
        """The deepest prefix of `lengths` whose batches fit in `time_ms` (0 when not even two fit)."""
        if len(lengths) < MIN_DEPTH:
            return 0
        if self._policy == "fixed":
            return len(lengths)
        cost = self._cost(tier)
        cost.settle()
        safety = cost.safety()

        def fits(n: int) -> bool:
            return cost.predict_batches(lengths[:n], tier.batch_size) * safety <= time_ms

        if not fits(MIN_DEPTH):
            return 0
        lo, hi = MIN_DEPTH, len(lengths)  # fits(lo) holds; find the largest n that fits
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _run(
        self, tier: Tier, pairs: Sequence[EncodedPair], time_left: Callable[[], float]
    ) -> tuple[dict[int, float], bool]:
        """Score `pairs` batch by batch; stop before a batch predicted not to fit. Returns scores, cut."""
        cost = self._cost(tier) if self._policy == "budget" else tier.cost
        scores: dict[int, float] = {}
        for batch in plan_batches([len(p) for p in pairs], tier.batch_size):
            tokens = padded_tokens([len(pairs[i]) for i in batch])
            if cost is not None and self._policy == "budget" and cost.predict(tokens) * cost.safety() > time_left():
                return scores, True
            t0 = self._timer()
            values = tier.encoder.score([pairs[i] for i in batch])
            if cost is not None:
                cost.observe(tokens, (self._timer() - t0) * 1000.0)
            scores.update(zip(batch, (float(v) for v in values), strict=True))
        return scores, False

    def rerank(self, query: str, passages: Sequence[Passage], deadline: Deadline) -> RerankOutcome:
        started = time.perf_counter()
        items = list(passages)
        out = RerankOutcome(items)
        if len(items) < MIN_DEPTH:
            return out
        # The fused scores as handed over, normalized over all of them; kept aligned with `items`.
        fused = list(normalized_fused([p.score for p in items]))

        def time_left() -> float:
            return self._time_left(deadline)

        depth_cap = len(items)
        for tier in self._tiers:
            want = min(tier.max_depth, depth_cap)
            pairs = self._plan_depth(tier, query, items[:want], time_left, out)
            if pairs is None:
                break
            scored = self._score_tier(tier, pairs, time_left, out)
            if scored is None:
                break
            scores = scored[0] if tier.ce_weight is None else _blended(scored[0], fused, tier.ce_weight)
            order = _order(scores, len(items))
            items = [replace(items[i], score=scores[i]) if i in scores else items[i] for i in order]
            fused = [fused[i] for i in order]
            if not self._combine(out, tier, scored, want):
                break
            # The next tier reads only what this tier ranked.
            depth_cap = len(scored[0])
        out.passages = items
        out.skipped = not out.tiers
        out.rerank_ms = (time.perf_counter() - started) * 1000.0
        return out

    def _plan_depth(
        self, tier: Tier, query: str, items: list[Passage], time_left: Callable[[], float], out: RerankOutcome
    ) -> list[EncodedPair] | None:
        """The pairs `tier` has time to score, encoded; None (with a note) when it is skipped."""
        if len(items) < MIN_DEPTH:
            out.truncated = out.truncated or bool(out.tiers)
            out.notes.append(f"{tier.name} skipped: fewer than {MIN_DEPTH} pairs to score")
            return None
        if time_left() <= 0:
            self._cut(out, tier, f"{tier.name} skipped: reranking budget spent")
            return None
        # Tokenizing costs time too: plan first on a low estimate of each pair's length (about 4-5
        # characters per token in English, so chars/6 rarely overshoots) and tokenize only that deep.
        guess = [min(self._max_seq_len, (len(query) + len(p.chunk.text)) // 6 + 3) for p in items]
        reach = self._plan(tier, guess, time_left())
        pairs = tier.encoder.encode(query, [p.chunk.text for p in items[:reach]]) if reach else []
        depth = self._plan(tier, [len(p) for p in pairs], time_left()) if reach else 0
        if depth == 0:
            self._cut(out, tier, f"{tier.name} skipped: {max(time_left(), 0.0):.1f} ms left is too little")
            return None
        return list(pairs[:depth])

    def _score_tier(
        self, tier: Tier, pairs: list[EncodedPair], time_left: Callable[[], float], out: RerankOutcome
    ) -> tuple[dict[int, float], bool] | None:
        """Scores by position, and whether the budget cut the run short; None when too few were scored."""
        scores, cut = self._run(tier, pairs, time_left)
        if len(scores) < MIN_DEPTH:
            self._cut(out, tier, f"{tier.name} stopped: a batch no longer fit in the budget")
            return None
        return scores, cut

    def _combine(self, out: RerankOutcome, tier: Tier, scored: tuple[dict[int, float], bool], want: int) -> bool:
        """Record the tier's depth; True when it scored all it wanted, so the next tier may run."""
        scores, cut = scored
        out.tiers.append(f"{tier.name}:{len(scores)}")
        if len(scores) >= want:
            return True
        out.truncated = True
        how = " (cut mid-way)" if cut else ""
        out.notes.append(f"{tier.name} scored {len(scores)} of {want} pairs{how}")
        if tier is not self._tiers[-1]:
            # Time was short for this tier: the later, costlier tier gives way first.
            out.notes.append(f"{self._tiers[-1].name} skipped: {tier.name} already used the budget")
        return False

    @staticmethod
    def _cut(out: RerankOutcome, tier: Tier, note: str) -> None:
        out.truncated = out.truncated or bool(out.tiers)
        out.notes.append(note)
