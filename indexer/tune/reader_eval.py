"""Held-out figures of a reader on a SQuAD-format set, each question read against its gold
paragraph: exact match, a gold answer inside the span, token overlap and F1 (answerable questions);
how well the no-answer score separates unanswerable from answerable questions (AUC), the
no-answer threshold that declines at most `decline_answerable` of the answerable ones and the
share of unanswerable ones it then declines; and milliseconds per call on this CPU."""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from indexer.tune.reader_data import SquadSet, article, normalize
from ragserve.read.base import Reader


@dataclass(frozen=True)
class ReaderFigures:
    data: str
    answerable: int
    unanswerable: int
    exact_match: float
    contains_gold: float  # the span holds a gold answer (normalised)
    overlaps_gold: float  # the span shares a token with a gold answer
    f1: float
    no_answer_auc: float | None  # of null - span score, unanswerable vs answerable
    threshold: float  # on span - null score: declined below it
    declined_answerable: float
    declined_unanswerable: float
    # Answerable questions read against another paragraph of their article that lacks the answer
    # (what retrieval hands a reader when it missed): AUC against the gold reads, share declined.
    other_paragraph_auc: float | None
    declined_other_paragraph: float
    ms_1_p50: float
    ms_1_p95: float
    ms_4_p50: float
    ms_4_p95: float

    def as_dict(self) -> dict[str, Any]:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(self).items()}


def token_f1(prediction: str, gold: str) -> float:
    pred, ref = normalize(prediction).split(), normalize(gold).split()
    common = sum((Counter(pred) & Counter(ref)).values())
    if not pred or not ref or common == 0:
        return float(pred == ref)
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def auc(positives: Sequence[float], negatives: Sequence[float]) -> float | None:
    """P(a positive scores above a negative), ties counting half (Mann-Whitney)."""
    if not positives or not negatives:
        return None
    ranked = sorted([(v, 1) for v in positives] + [(v, 0) for v in negatives])
    rank_sum, i = 0.0, 0
    while i < len(ranked):
        j = i
        while j < len(ranked) and ranked[j][0] == ranked[i][0]:
            j += 1
        mean_rank = (i + 1 + j) / 2
        rank_sum += mean_rank * sum(1 for _, p in ranked[i:j] if p)
        i = j
    n_pos, n_neg = len(positives), len(negatives)
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def decline_threshold(answerable_margins: Sequence[float], share: float) -> float:
    """The highest threshold on span - null that declines (margin below it) at most `share` of these."""
    ordered = sorted(answerable_margins)
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def evaluate_reader(
    reader: Reader, data: SquadSet, decline_answerable: float = 0.10, batch4_questions: int = 100, seed: int = 0
) -> ReaderFigures:
    em, contains, overlaps, f1s, answerable_margins, unanswerable_margins = [], [], [], [], [], []
    ms_1: list[float] = []
    other_margins: list[float] = []
    rng = random.Random(seed)
    for q in data.questions:
        started = time.perf_counter()
        (span,) = reader.read(q.question, [data.paragraphs[q.doc_id]])
        ms_1.append((time.perf_counter() - started) * 1000)
        if q.impossible or not q.answers:
            unanswerable_margins.append(span.margin)
            continue
        answerable_margins.append(span.margin)
        pred = normalize(span.text)
        em.append(max(float(pred == normalize(a)) for a in q.answers))
        contains.append(max(float(bool(normalize(a)) and normalize(a) in pred) for a in q.answers))
        scores = [token_f1(span.text, a) for a in q.answers]
        f1s.append(max(scores))
        overlaps.append(float(max(scores) > 0))
        others = [
            d
            for d in data.paragraphs
            if article(d) == article(q.doc_id)
            and d != q.doc_id
            and not any(normalize(a) in normalize(data.paragraphs[d]) for a in q.answers)
        ]
        if others:
            (other,) = reader.read(q.question, [data.paragraphs[rng.choice(others)]])
            other_margins.append(other.margin)
    threshold = decline_threshold(answerable_margins, decline_answerable)
    ms_4 = _time_batches_of_4(reader, data, batch4_questions, seed)

    def mean(values: list[float]) -> float:
        return sum(values) / len(values) if values else float("nan")

    return ReaderFigures(
        data=data.name,
        answerable=len(answerable_margins),
        unanswerable=len(unanswerable_margins),
        exact_match=mean(em),
        contains_gold=mean(contains),
        overlaps_gold=mean(overlaps),
        f1=mean(f1s),
        no_answer_auc=auc([-m for m in unanswerable_margins], [-m for m in answerable_margins]),
        threshold=threshold,
        declined_answerable=mean([float(m < threshold) for m in answerable_margins]),
        declined_unanswerable=mean([float(m < threshold) for m in unanswerable_margins]),
        other_paragraph_auc=auc([-m for m in other_margins], [-m for m in answerable_margins]),
        declined_other_paragraph=mean([float(m < threshold) for m in other_margins]),
        ms_1_p50=percentile(ms_1, 50),
        ms_1_p95=percentile(ms_1, 95),
        ms_4_p50=percentile(ms_4, 50),
        ms_4_p95=percentile(ms_4, 95),
    )


def _time_batches_of_4(reader: Reader, data: SquadSet, questions: int, seed: int) -> list[float]:
    """Milliseconds of one read of 4 paragraphs (the gold one and 3 more of its article)."""
    rng = random.Random(seed)
    chosen = rng.sample(data.questions, min(questions, len(data.questions)))
    times = []
    for q in chosen:
        same = [d for d in data.paragraphs if article(d) == article(q.doc_id) and d != q.doc_id]
        others = rng.sample(same, min(3, len(same)))
        started = time.perf_counter()
        reader.read(q.question, [data.paragraphs[d] for d in [q.doc_id, *others]])
        times.append((time.perf_counter() - started) * 1000)
    return times
