"""Evidence at retrieval time: each passage's sentence that best matches the question, and how well
the passages support an answer at all.

The same lexical scoring the context budget uses (request/sentences.py): no model call, well under
a millisecond for a few passages (BENCHMARKS.md, "Highlights and abstention"). A client can show a
highlight before the generator's first token; it is evidence, never the generated answer.
"""

from __future__ import annotations

import dataclasses

from ragserve.request.sentences import content_terms, question_weights, sentence_spans
from ragserve.types import Highlight, Passage, RetrievalResult, Support

# Coverage a later passage's highlight must gain, per place in the ranking, to be shown as the
# evidence over an earlier one: retrieval's order is evidence too (BENCHMARKS.md, "Highlights").
EVIDENCE_RANK_PENALTY = 0.1


def highlight_passages(question: str, passages: list[Passage]) -> tuple[list[Passage], float]:
    """The passages, each with its best sentence (ties: the earlier one), and the best coverage."""
    spans = [sentence_spans(p.chunk.text) for p in passages]
    terms = [[content_terms(p.chunk.text[s:e]) for s, e in own] for p, own in zip(passages, spans, strict=True)]
    weights = question_weights(question, [t for own in terms for t in own])
    out: list[Passage] = []
    best = 0.0
    for passage, own_spans, own_terms in zip(passages, spans, terms, strict=True):
        if not own_spans:
            out.append(passage)
            continue
        scores = [weights.coverage(t) for t in own_terms]
        top = max(range(len(scores)), key=lambda i: (scores[i], -i))
        start, end = own_spans[top]
        out.append(dataclasses.replace(passage, highlight=Highlight(start, end, scores[top])))
        best = max(best, scores[top])
    return out, best


def evidence_passage(passages: list[Passage]) -> int:
    """Index of the passage whose highlight to show as the evidence (0 when none has one)."""
    scored = [
        (p.highlight.coverage - EVIDENCE_RANK_PENALTY * i, -i)
        for i, p in enumerate(passages)
        if p.highlight is not None
    ]
    return -max(scored)[1] if scored else 0


def with_evidence(question: str, result: RetrievalResult, low_support_below: float) -> RetrievalResult:
    """A copy of `result` with highlights and support (the original may sit in a cache)."""
    passages, coverage = highlight_passages(question, result.passages)
    support = Support(coverage, coverage < low_support_below, evidence_passage(passages))
    return dataclasses.replace(result, passages=passages, support=support)
