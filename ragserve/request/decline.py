"""The decline before the generator: are the documents about this question at all?

One decision per Query, after retrieval and before the engine is called, from what retrieval
already holds: the passages' raw cosine and BM25 scores (index/fusion.py carries them through
fusion) and the request's sentence table (request/sentences.py). No model call; tens of
microseconds. A small logistic model weighs the signals; it ships as JSON beside this module
(`decline_model.json`, fitted by `ragserve-index tune-decline` with leave-one-article-out SQuAD
2.0 train questions) with a calibration table: for each share of covered questions it may decline,
the score threshold that declines that share on the fitting data.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ragserve.events import DeclineEvidence
from ragserve.request.sentences import SentenceTable
from ragserve.types import RetrievalResult

SHIPPED_MODEL = Path(__file__).with_name("decline_model.json")


def _dense(result: RetrievalResult) -> list[float]:
    return sorted((p.dense for p in result.passages if p.dense is not None), reverse=True)


def top_dense(result: RetrievalResult, table: SentenceTable) -> float | None:
    """The best raw cosine among the passages: how close the nearest chunk really is."""
    scores = _dense(result)
    return scores[0] if scores else None


def dense_drop(result: RetrievalResult, table: SentenceTable) -> float | None:
    """How far the cosine falls from the best passage to the next: one passage standing out."""
    scores = _dense(result)
    return scores[0] - scores[1] if len(scores) > 1 else None


def top_lexical(result: RetrievalResult, table: SentenceTable) -> float | None:
    """The best BM25 score, log-scaled (0 when no passage shares a term with the question)."""
    scores = [p.lexical for p in result.passages if p.lexical is not None]
    return math.log1p(max(scores)) if scores else 0.0


def coverage(result: RetrievalResult, table: SentenceTable) -> float | None:
    """The best sentence's share of the question's weighted content words (Support.coverage)."""
    return result.support.coverage if result.support is not None else None


def found(result: RetrievalResult, table: SentenceTable) -> float | None:
    """The share of the question's weight held anywhere in the passages."""
    held = set().union(*(terms for p in table.passages for terms in p.terms))
    return table.weights.coverage(held) if table.weights.idf else None


def missing_terms(result: RetrievalResult, table: SentenceTable) -> float | None:
    """How many of the question's content words no passage holds (a name the corpus lacks)."""
    held = set().union(*(terms for p in table.passages for terms in p.terms))
    return float(sum(1 for term in table.weights.idf if term not in held))


Signal = Callable[[RetrievalResult, SentenceTable], float | None]
SIGNALS: dict[str, Signal] = {
    "top_dense": top_dense,
    "dense_drop": dense_drop,
    "top_lexical": top_lexical,
    "coverage": coverage,
    "found": found,
    "missing_terms": missing_terms,
}


def signals_of(result: RetrievalResult, table: SentenceTable, names: tuple[str, ...]) -> dict[str, float] | None:
    """The named signals, or None when one cannot be measured (no passages, no dense scores)."""
    if not result.passages:
        return None
    values: dict[str, float] = {}
    for name in names:
        value = SIGNALS[name](result, table)
        if value is None:
            return None
        values[name] = value
    return values


@dataclass(frozen=True, slots=True)
class DeclineModel:
    """P(the documents do not cover the question) = sigmoid(bias + sum w * (x - mean) / std)."""

    names: tuple[str, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    weights: tuple[float, ...]
    bias: float
    # (share of covered questions declined, score threshold), by rising share.
    calibration: tuple[tuple[float, float], ...]
    embedder: str = ""  # the cosine's model: another embedder's cosines are on another scale

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DeclineModel:
        names = tuple(str(n) for n in data["names"])
        unknown = [n for n in names if n not in SIGNALS]
        if unknown:
            raise ValueError(f"decline model names unknown signals: {unknown}")
        mean, std, weights = (tuple(float(v) for v in data[key]) for key in ("mean", "std", "weights"))
        if any(len(v) != len(names) for v in (mean, std, weights)) or any(s <= 0 for s in std):
            raise ValueError("decline model: mean, std and weights must match its signals (std > 0)")
        calibration = tuple(sorted((float(r), float(t)) for r, t in data["calibration"]))
        if not calibration:
            raise ValueError("decline model: an empty calibration table")
        return cls(names, mean, std, weights, float(data["bias"]), calibration, str(data.get("embedder", "")))

    @classmethod
    def load(cls, path: Path = SHIPPED_MODEL) -> DeclineModel:
        return cls.from_json(json.loads(path.read_text()))

    def score(self, values: dict[str, float]) -> float:
        z = self.bias + sum(
            w * (values[n] - m) / s for n, m, s, w in zip(self.names, self.mean, self.std, self.weights, strict=True)
        )
        return 1.0 / (1.0 + math.exp(-max(-60.0, min(60.0, z))))

    def threshold_for(self, false_rate: float) -> float:
        """The score threshold declining `false_rate` of covered questions on the fitting data
        (linear between the table's rows, clamped to its ends)."""
        table = self.calibration
        if false_rate <= table[0][0]:
            return table[0][1]
        for (r0, t0), (r1, t1) in itertools.pairwise(table):
            if false_rate <= r1:
                return t0 + (t1 - t0) * (false_rate - r0) / (r1 - r0) if r1 > r0 else t1
        return table[-1][1]


@dataclass(frozen=True, slots=True)
class Decline:
    """The decision as served: the model and the threshold the operator's false rate picked."""

    model: DeclineModel
    threshold: float

    @classmethod
    def at(cls, model: DeclineModel, false_rate: float) -> Decline | None:
        """None (never declines) when `false_rate` is 0."""
        return cls(model, model.threshold_for(false_rate)) if false_rate > 0 else None

    def judge(self, result: RetrievalResult, table: SentenceTable) -> DeclineEvidence | None:
        """The evidence when the question should be declined; None to answer."""
        values = signals_of(result, table, self.model.names)
        if values is None:
            return None
        score = self.model.score(values)
        return DeclineEvidence(score, self.threshold, values) if score >= self.threshold else None


def judge(decline: Decline | None, result: RetrievalResult, table: SentenceTable) -> DeclineEvidence | None:
    """`Decline.judge`, or None when the decision is off."""
    return decline.judge(result, table) if decline is not None else None
