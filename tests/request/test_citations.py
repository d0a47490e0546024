"""The citation tracker: markers found as the text streams (split across tokens or not), the answer
span each supports, the quoted sentence by its place in the source, and the lexical support check."""

from __future__ import annotations

from ragserve.request.citations import CitationTracker, holds
from ragserve.request.sentences import content_terms
from ragserve.source_location import SourceLocation
from ragserve.types import Chunk, Passage

SOURCE = (
    "Intro line. The Eiffel Tower was completed in 1889 for the World's Fair. "
    "It is 330 metres tall. Gustave Eiffel's company built it."
)
CHUNK_START = SOURCE.index("The Eiffel")
TOWER = Chunk("tower.md#1", "tower.md", SOURCE[CHUNK_START:], "Tower", start=CHUNK_START, end=len(SOURCE))
TOWER = Chunk(**{**{f: getattr(TOWER, f) for f in TOWER.__slots__}, "location": SourceLocation("tower.md")})
BEES = Chunk("bees.md#0", "bees.md", "Honey bees dance to share where food is.", "Bees")
PASSAGES = [Passage(TOWER, 1.0, 1), Passage(BEES, 0.5, 2)]


def _feed(pieces: list[str]) -> tuple[CitationTracker, list[list[int]]]:
    tracker = CitationTracker(PASSAGES)
    return tracker, [[c.marker for c in tracker.feed(piece)] for piece in pieces]


def test_a_marker_split_over_tokens_is_cited_once_when_it_closes() -> None:
    tracker, found = _feed(["It was completed in 1889 [", "1", "]", " and bees dance [2][1", "]."])
    assert found == [[], [], [1], [2], [1]]
    first, bees, both = tracker.citations
    assert tracker.text[first.answer_start : first.answer_end] == "It was completed in 1889"
    assert tracker.text[bees.answer_start : bees.answer_end] == "and bees dance"
    assert (both.answer_start, both.answer_end) == (bees.answer_start, bees.answer_end)  # "x [2][1]"
    assert first.supported and bees.supported and not both.supported
    assert tracker.unsupported()


def test_the_quote_is_the_matching_sentence_at_its_place_in_the_source() -> None:
    tracker, _ = _feed(["The tower is 330 metres tall [1]."])
    citation = tracker.citations[0]
    assert citation.quote == "It is 330 metres tall."
    assert SOURCE[citation.quote_start : citation.quote_end] == citation.quote
    assert citation.chunk.location == SourceLocation("tower.md") and citation.passage == 0


def test_numbers_no_passage_has_and_unknown_markers() -> None:
    tracker, found = _feed(["It is 400 metres tall [1]. See [7]."])
    assert found == [[1]] and not tracker.citations[0].supported
    assert holds("completed in 1889", TOWER.text, frozenset(content_terms(TOWER.text)))
    assert not holds("finished in purple granite", TOWER.text, frozenset(content_terms(TOWER.text)))
    assert holds("it is so", TOWER.text, frozenset())  # nothing to check: no content words


def test_uncited_text_counts_against_the_answer_only_when_no_passage_holds_it() -> None:
    assert not _feed(["Gustave Eiffel's company built the tower."])[0].unsupported()
    assert _feed(["Napoleon designed submarines."])[0].unsupported()
    assert not _feed([""])[0].unsupported()
