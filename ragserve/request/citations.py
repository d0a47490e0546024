"""Citations as they are written: each marker `[n]` the answer streams becomes a Citation event
right after the token that completes it (before the tokens that follow), located in its source and
checked for support; the final event repeats them all and says whether the whole answer is held
by the passages (docs/evidence.md, "Citations").

The support check is lexical, what a CPU affords in the stream: the content words and numbers of
the answer text a marker closes must be found in the cited passage. It catches an answer the
passages do not hold; it cannot tell a wrong reading of words the passage does hold."""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import AsyncGenerator, Sequence

from ragserve.events import Citation, FinalSummary, QueryEvent, TokenDelta
from ragserve.request.sentences import analysis_of, content_terms
from ragserve.types import Passage, RetrievalResult

_MARKER = re.compile(r"\[(\d{1,3})\]")
# A claim starts after the previous marker, or at its sentence's start when that is later.
_CLAIM_START = re.compile(r"(?:[.!?;]\s+|\n)")
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
# The share of a claim's content words the cited passage must hold (BENCHMARKS.md, "Citations").
SUPPORTED_SHARE = 0.6
_MARKER_MAX_CHARS = 5  # "[999]": a longer unclosed "[" is not a marker in the making


def holds(claim: str, passage_text: str, passage_terms: frozenset[str] | set[str]) -> bool:
    """The passage holds the claim: every number in it, and SUPPORTED_SHARE of its content words.
    A claim without content words claims nothing to check."""
    if any(number not in passage_text for number in _NUMBER.findall(claim)):
        return False
    terms = content_terms(claim)
    if not terms:
        return True
    return len(terms & passage_terms) >= SUPPORTED_SHARE * len(terms)


def _passage_terms(passage: Passage) -> frozenset[str]:
    return frozenset().union(*analysis_of(passage.chunk).terms)


class CitationTracker:
    """Follows one answer's text as it streams; `feed` returns the citations its new text closed."""

    def __init__(self, passages: Sequence[Passage]) -> None:
        self._passages = {p.rank or n: (n, p) for n, p in enumerate(passages, start=1)}
        self._terms: dict[int, frozenset[str]] = {}
        self.text = ""
        self._scanned = 0  # markers are looked for from here on
        self._claim_from = 0  # the end of the last marker
        self.citations: list[Citation] = []
        self._last: Citation | None = None

    def feed(self, delta: str) -> list[Citation]:
        self.text += delta
        found: list[Citation] = []
        for match in _MARKER.finditer(self.text, self._scanned):
            citation = self._cite(int(match.group(1)), match.start())
            self._claim_from = match.end()
            if citation is not None:
                found.append(citation)
        # An unclosed "[12" at the end may still become a marker: look at it again next time.
        tail = self.text.rfind("[", max(self._scanned, self._claim_from))
        unclosed = tail >= 0 and "]" not in self.text[tail:] and len(self.text) - tail <= _MARKER_MAX_CHARS
        self._scanned = tail if unclosed else len(self.text)
        self.citations.extend(found)
        return found

    def _claim_span(self, marker_at: int) -> tuple[int, int]:
        start = self._claim_from
        for boundary in _CLAIM_START.finditer(self.text, start, marker_at):
            if boundary.end() < marker_at:
                start = boundary.end()
        claim = self.text[start:marker_at]
        while start < marker_at and (claim[:1].isspace() or claim[:1] in ",;"):
            start, claim = start + 1, claim[1:]
        end = start + len(claim.rstrip())
        return start, end

    def _cite(self, marker: int, at: int) -> Citation | None:
        entry = self._passages.get(marker)
        if entry is None:
            return None  # a number no passage has: not a citation
        n, passage = entry
        start, end = self._claim_span(at)
        claim = self.text[start:end]
        if not claim.strip() and self._last is not None:  # "x [1][2]": both support x
            start, end = self._last.answer_start, self._last.answer_end
            claim = self.text[start:end]
        terms = self._terms.setdefault(n, _passage_terms(passage))
        quote_from, quote_to = _quoted_sentence(passage, claim)
        chunk = passage.chunk
        self._last = Citation(
            marker=marker,
            answer_start=start,
            answer_end=end,
            passage=n - 1,
            chunk=chunk,
            quote=chunk.text[quote_from:quote_to],
            quote_start=chunk.start + quote_from,
            quote_end=chunk.start + quote_to,
            supported=holds(claim, chunk.text, terms),
        )
        return self._last

    def unsupported(self) -> bool:
        """Some of the answer is held by no passage: a citation whose passage does not hold its
        claim, or uncited text that no passage holds."""
        if any(not c.supported for c in self.citations):
            return True
        uncited = _MARKER.sub(" ", self._uncited_text())
        if not content_terms(uncited) and not _NUMBER.search(uncited):
            return False
        entries = list(self._passages.values())
        return not any(holds(uncited, p.chunk.text, self._terms.setdefault(n, _passage_terms(p))) for n, p in entries)

    def _uncited_text(self) -> str:
        text = self.text
        for citation in reversed(self.citations):
            text = text[: citation.answer_start] + " " + text[citation.answer_end :]
        return text


def _quoted_sentence(passage: Passage, claim: str) -> tuple[int, int]:
    """The passage sentence sharing most content words with the claim; the highlight (else the
    first sentence) when none shares any."""
    analysis = analysis_of(passage.chunk)
    claimed = content_terms(claim)
    best, best_shared = None, 0
    for span, terms in zip(analysis.spans, analysis.terms, strict=True):
        shared = len(claimed & terms)
        if shared > best_shared:
            best, best_shared = span, shared
    if best is not None:
        return best
    if passage.highlight is not None:
        return passage.highlight.start, passage.highlight.end
    return analysis.spans[0] if analysis.spans else (0, len(passage.chunk.text))


async def with_citations(events: AsyncGenerator[QueryEvent, None]) -> AsyncGenerator[QueryEvent, None]:
    """A Query's events with a Citation after each token that closes a marker, and the final
    event carrying them all and whether the answer is supported. A declined answer cites nothing
    and claims nothing. Closing this closes `events` at once (a caller gone aborts the engine request)."""
    tracker: CitationTracker | None = None
    async with contextlib.aclosing(events):
        async for event in events:
            if isinstance(event, RetrievalResult):
                tracker = CitationTracker(event.passages)
                yield event
            elif isinstance(event, TokenDelta) and tracker is not None:
                yield event
                for citation in tracker.feed(event.text):
                    yield citation
            elif isinstance(event, FinalSummary) and tracker is not None and not event.declined:
                unsupported = tracker.unsupported()
                yield dataclasses.replace(event, citations=tuple(tracker.citations), unsupported=unsupported)
            else:
                yield event
