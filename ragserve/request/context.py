"""Fit the retrieved passages into a context token budget: keep the sentences that match the question.

Every uncached prompt token costs prefill time (about 3.4 ms per token per core on a Zen 3 core
for SmolLM2-135M), so the passages are the one big lever on time to first token. Each passage is
split into sentences; a sentence scores the summed rarity (IDF over the candidate sentences of
this request) of the question's stemmed content words it contains. Every passage first keeps its
best sentence (so its id and citation stay meaningful), then the best remaining sentences are
added while they fit. Kept sentences stay in document order; a gap is marked with an ellipsis.
Each passage's title is rendered in the prompt too, so it counts against the budget (whole).

Lexical overlap needs no model call; the cost is counting tokens, one tokenizer call per sentence
(BENCHMARKS.md, "Prompt work per Query by top_k": batching those calls is the next saving).
The retrieval event still carries the whole passages; only the prompt is cut.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache

import Stemmer
from bm25s.stopwords import STOPWORDS_EN_PLUS

from ragserve.prompt import passage_label
from ragserve.types import Passage

# A sentence ends at . ! or ? followed by space and something that starts a sentence.
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")
_ABBREVIATION_END = re.compile(r"\b(?:Dr|Mr|Mrs|Ms|Prof|St|Jr|Sr|Inc|Ltd|Co|vs|No|Fig|e\.g|i\.e|etc)\.$")
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
GAP = "…"

# Question words and function words carry no evidence of where the answer is.
_STOPWORDS = frozenset(STOPWORDS_EN_PLUS) | {"many", "much", "also", "called", "known", "named"}


@lru_cache(maxsize=1)
def _stemmer() -> Stemmer.Stemmer:
    return Stemmer.Stemmer("english")


def content_terms(text: str) -> set[str]:
    words = [w for w in _WORD.findall(text.lower()) if w not in _STOPWORDS]
    return set(_stemmer().stemWords(words))


def split_sentences(text: str) -> list[str]:
    sentences: list[str] = []
    for piece in _SENTENCE_END.split(text.strip()):
        piece = piece.strip()
        if not piece:
            continue
        if sentences and _ABBREVIATION_END.search(sentences[-1]):
            sentences[-1] = f"{sentences[-1]} {piece}"  # "Dr. Smith" is one sentence
        else:
            sentences.append(piece)
    return sentences


@dataclass(frozen=True, slots=True)
class FittedContext:
    """The passages as they go into the prompt, and their token counts before and after the cut."""

    passages: list[Passage]
    tokens: int
    tokens_full: int


@dataclass(slots=True)
class _Sentence:
    passage: int
    position: int
    text: str
    tokens: int
    terms: set[str]
    score: float = 0.0


def fit_context(
    question: str, passages: list[Passage], budget_tokens: int, count_tokens: Callable[[str], int]
) -> FittedContext:
    """`budget_tokens` 0 keeps the whole passages (only counting them). Titles count but are never
    cut: when they alone fill the budget, every passage is quoted as a gap marker."""
    titles = sum(_title_tokens(p, count_tokens) for p in passages)
    full = [count_tokens(p.chunk.text.strip()) for p in passages]
    if budget_tokens <= 0 or titles + sum(full) <= budget_tokens:
        return FittedContext(list(passages), titles + sum(full), titles + sum(full))

    sentences = [
        _Sentence(i, j, text, count_tokens(text), content_terms(text))
        for i, passage in enumerate(passages)
        for j, text in enumerate(split_sentences(passage.chunk.text))
    ]
    _score_sentences(content_terms(question), sentences)
    chosen = _choose_sentences(sentences, len(passages), budget_tokens - titles, count_tokens(GAP))
    fitted = [
        replace(passage, chunk=replace(passage.chunk, text=_quote([s for s in sentences if s.passage == i], chosen)))
        for i, passage in enumerate(passages)
    ]
    return FittedContext(fitted, titles + sum(count_tokens(p.chunk.text) for p in fitted), titles + sum(full))


def _title_tokens(passage: Passage, count_tokens: Callable[[str], int]) -> int:
    # build_prompt renders every passage's title (or its document id): one tokenizer call a passage.
    return count_tokens(passage_label(passage))


def _score_sentences(question_terms: set[str], sentences: list[_Sentence]) -> None:
    """Each sentence scores the idf of the question terms it holds (rarer terms weigh more)."""
    n = len(sentences)
    for term in question_terms:
        df = sum(1 for s in sentences if term in s.terms)
        if df:
            idf = math.log(1.0 + n / df)
            for s in sentences:
                if term in s.terms:
                    s.score += idf


def _choose_sentences(
    sentences: list[_Sentence], passages: int, budget_tokens: int, gap_tokens: int
) -> set[tuple[int, int]]:
    """(passage, position) of the sentences that fit in the budget, the best first."""
    # Each kept sentence can bring one gap marker, and each passage one more: charging them up
    # front keeps the assembled text within the budget.
    chosen: set[tuple[int, int]] = set()
    used = gap_tokens * passages

    def take(s: _Sentence) -> None:
        nonlocal used
        cost = s.tokens + gap_tokens
        if (s.passage, s.position) not in chosen and used + cost <= budget_tokens:
            chosen.add((s.passage, s.position))
            used += cost

    # Best sentence of each passage first, in retrieval order; ties go to the earlier sentence.
    for i in range(passages):
        own = [s for s in sentences if s.passage == i]
        if own:
            take(max(own, key=lambda s: (s.score, -s.position)))
    # Then the best of the rest, across passages; a better-ranked passage wins a tie.
    for s in sorted(sentences, key=lambda s: (-s.score, s.passage, s.position)):
        if s.score > 0:
            take(s)
    return chosen


def _quote(own: list[_Sentence], chosen: set[tuple[int, int]]) -> str:
    """One passage's kept sentences in order, a gap marker wherever text was left out."""
    kept = sorted(s.position for s in own if (s.passage, s.position) in chosen)
    if not kept:
        # Not even one sentence fitted: the passage stays numbered, with nothing quoted.
        return GAP
    by_position = {s.position: s.text for s in own}
    parts: list[str] = []
    if kept[0] > 0:
        parts.append(GAP)
    for k, position in enumerate(kept):
        if k and position != kept[k - 1] + 1:
            parts.append(GAP)
        parts.append(by_position[position])
    if kept[-1] < max(by_position):
        parts.append(GAP)
    return " ".join(parts)
