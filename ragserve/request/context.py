"""Fit the retrieved passages into a context token budget: keep the sentences that match the question.

Every uncached prompt token costs prefill time (docs/ttft.md), so the passages are the one big
lever on time to first token. Each passage's sentences are scored by the request's sentence
table (request/sentences.py), the same scores the evidence highlight uses. Every passage first keeps its
best sentence (so its id and citation stay meaningful), then the best remaining sentences are
added while they fit. Kept sentences stay in document order; a gap is marked with an ellipsis.
Each passage's title is rendered in the prompt too, so it counts against the budget (whole).

Lexical overlap needs no model call; the cost is counting tokens, one tokenizer call per sentence
(BENCHMARKS.md, "Prompt work per Query by top_k": batching those calls is the next saving).
The retrieval event still carries the whole passages; only the prompt is cut.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from ragserve.prompt import passage_label
from ragserve.request.sentences import SentenceTable
from ragserve.types import Passage

GAP = "…"


@dataclass(frozen=True, slots=True)
class FittedContext:
    """The passages as they go into the prompt, and their token counts before and after the cut."""

    passages: list[Passage]
    tokens: int
    tokens_full: int


@dataclass(frozen=True, slots=True)
class _Sentence:
    passage: int
    position: int
    text: str
    tokens: int
    score: float


def fit_context(
    question: str,
    passages: list[Passage],
    budget_tokens: int,
    count_tokens: Callable[[str], int],
    whole_first_max_tokens: int = 0,
    table: SentenceTable | None = None,
) -> FittedContext:
    """`budget_tokens` 0 keeps the whole passages (only counting them). Titles count but are never
    cut: when they alone fill the budget, every passage is quoted as a gap marker.

    `whole_first_max_tokens` > 0 (the reusable prompt layout): the top passage, when it has at most
    that many tokens, goes in whole, the same whatever the question, so a later question that
    retrieves it first finds the template and that passage in the engine's prefix cache; the rest
    are cut to what is left of the budget, and left out when nothing of theirs fits.

    `table`: the request's sentence table over `passages` (built here when not given)."""
    titles = sum(_title_tokens(p, count_tokens) for p in passages)
    full = [count_tokens(p.chunk.text.strip()) for p in passages]
    if budget_tokens <= 0 or titles + sum(full) <= budget_tokens:
        return FittedContext(list(passages), titles + sum(full), titles + sum(full))
    table = table or SentenceTable.of(question, [p.chunk for p in passages])
    if passages and 0 < full[0] <= whole_first_max_tokens:
        rest = _fit_sentences(table, 1, passages[1:], budget_tokens - titles - full[0], count_tokens)
        # A passage reduced to a gap marker tells the model nothing and costs uncached tokens on
        # every request: left out (the retrieval event still has it; citations keep their numbers).
        fitted = [passages[0], *(p for p in rest if p.chunk.text != GAP)]
    else:
        fitted = _fit_sentences(table, 0, passages, budget_tokens - titles, count_tokens)
    # Titles of passages left out are not in the prompt.
    tokens = sum(_title_tokens(p, count_tokens) + count_tokens(p.chunk.text.strip()) for p in fitted)
    return FittedContext(fitted, tokens, titles + sum(full))


def _fit_sentences(
    table: SentenceTable,
    first: int,
    passages: list[Passage],
    budget_tokens: int,
    count_tokens: Callable[[str], int],
) -> list[Passage]:
    """Each passage cut to its sentences that best match the question, all within `budget_tokens`.
    `passages` are the table's from position `first` on."""
    sentences = [
        _Sentence(i, j, text, count_tokens(text), score)
        for i, passage in enumerate(passages)
        for j, text, score in zip(
            range(len(table.passages[first + i].spans)),
            (passage.chunk.text[s:e] for s, e in table.passages[first + i].spans),
            table.scores(first + i),
            strict=True,
        )
    ]
    chosen = _choose_sentences(sentences, len(passages), budget_tokens, count_tokens(GAP))
    return [
        replace(passage, chunk=replace(passage.chunk, text=_quote([s for s in sentences if s.passage == i], chosen)))
        for i, passage in enumerate(passages)
    ]


def _title_tokens(passage: Passage, count_tokens: Callable[[str], int]) -> int:
    # build_prompt renders every passage's title (or its document id): one tokenizer call a passage.
    return count_tokens(passage_label(passage))


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
