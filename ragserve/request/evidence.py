"""Evidence at retrieval time: each passage's sentence that best matches the question, and how well
the passages support an answer at all.

The request's one sentence table (request/sentences.py), which the context budget uses too: no
model call, well under a millisecond for a few passages (BENCHMARKS.md, "Highlights and
abstention"). A client can show a highlight before the generator's first token; it is evidence,
never the generated answer.
"""

from __future__ import annotations

import dataclasses

from ragserve.request.sentences import SentenceTable, content_terms
from ragserve.types import AnswerSpan, Highlight, Passage, RetrievalResult, Support

# Coverage a later passage's highlight must gain, per place in the ranking, to be shown as the
# evidence over an earlier one: retrieval's order is evidence too (BENCHMARKS.md, "Highlights").
EVIDENCE_RANK_PENALTY = 0.1


def highlight_passages(
    question: str, passages: list[Passage], table: SentenceTable | None = None
) -> tuple[list[Passage], float]:
    """The passages, each with its best sentence (ties: the earlier one), and the best coverage.
    `table`: the request's sentences over these passages (built here when not given)."""
    table = table or SentenceTable.of(question, [p.chunk for p in passages])
    out: list[Passage] = []
    best = 0.0
    for i, passage in enumerate(passages):
        top = table.best(i)
        if top is None:
            out.append(passage)
            continue
        coverage = table.coverages(i)[top]
        start, end = table.passages[i].spans[top]
        out.append(dataclasses.replace(passage, highlight=Highlight(start, end, coverage)))
        best = max(best, coverage)
    return out, best


def evidence_passage(passages: list[Passage]) -> int:
    """Index of the passage whose highlight to show as the evidence (0 when none has one)."""
    scored = [
        (p.highlight.coverage - EVIDENCE_RANK_PENALTY * i, -i)
        for i, p in enumerate(passages)
        if p.highlight is not None
    ]
    return -max(scored)[1] if scored else 0


def with_evidence(
    question: str, result: RetrievalResult, low_support_below: float, table: SentenceTable | None = None
) -> RetrievalResult:
    """A copy of `result` with highlights and support (the original may sit in a cache)."""
    passages, coverage = highlight_passages(question, result.passages, table)
    support = Support(coverage, coverage < low_support_below, evidence_passage(passages))
    return dataclasses.replace(result, passages=passages, support=support)


def with_answer(
    question: str,
    result: RetrievalResult,
    answer: AnswerSpan | None,
    highlight: bool,
    table: SentenceTable | None = None,
) -> RetrievalResult:
    """A copy of `result` with the reader's span. `highlight`: a span that answers makes the
    sentence holding it its passage's highlight, and that passage the evidence shown."""
    if not highlight or answer is None or not answer.answers or answer.passage >= len(result.passages):
        return dataclasses.replace(result, answer=answer)
    table = table or SentenceTable.of(question, [p.chunk for p in result.passages])
    passages = list(result.passages)
    shown = passages[answer.passage]
    sentence = shown.chunk.text[answer.sentence_start : answer.sentence_end]
    coverage = table.weights.coverage(content_terms(sentence))
    passages[answer.passage] = dataclasses.replace(
        shown, highlight=Highlight(answer.sentence_start, answer.sentence_end, coverage)
    )
    support = result.support or Support(coverage, False)
    support = dataclasses.replace(support, evidence_passage=answer.passage)
    return dataclasses.replace(result, passages=passages, support=support, answer=answer)
