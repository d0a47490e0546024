"""One sentence table per request: the highlight and the context budget weigh sentences alike, and a
chunk's sentences are split and stemmed once while it stays in memory."""

from __future__ import annotations

from ragserve.request.context import _title_tokens, fit_context
from ragserve.request.evidence import highlight_passages
from ragserve.request.sentences import SentenceTable, analyse, analyse_text
from ragserve.types import Chunk, Passage

QUESTION = "Which river flows through Lyon?"
TOP = "The river Rhone flows south. The river is long. A river flows past many towns. Its river water is cold."
SECOND = "The river flows fast here. Lyon sits on the Saone."
THIRD = "Paris has a different river. Boats flow on it."


def _passages() -> list[Passage]:
    return [Passage(Chunk(f"d{i}#0", f"d{i}", text), 1.0, i + 1) for i, text in enumerate([TOP, SECOND, THIRD])]


def _words(text: str) -> int:
    return len(text.split())


def test_the_sentence_kept_in_the_prompt_is_the_one_highlighted() -> None:
    # Weighed over the other passages alone, "river" is rare and "The river flows fast here." wins;
    # over the request's passages (what the highlight weighs), "Lyon" is the rarer evidence.
    passages = _passages()
    table = SentenceTable.of(QUESTION, [p.chunk for p in passages])
    highlighted, _ = highlight_passages(QUESTION, passages, table)
    shown = highlighted[1].highlight
    assert shown is not None and SECOND[shown.start : shown.end] == "Lyon sits on the Saone."
    titles = sum(_title_tokens(p, _words) for p in passages)
    # Room for the top passage whole and one sentence of the next.
    fitted = fit_context(QUESTION, passages, titles + _words(TOP) + 8, _words, 100, table)
    assert fitted.passages[1].chunk.text == "… Lyon sits on the Saone."
    # Built without a table, the context weighs the same way.
    assert fit_context(QUESTION, passages, titles + _words(TOP) + 8, _words, 100).passages == fitted.passages


def test_a_chunk_is_analysed_once_while_it_stays_in_memory() -> None:
    text = "A chunk never seen before by this test. It has two sentences."
    first = analyse(text)
    hits = analyse.cache_info().hits
    table = SentenceTable.of("What has two sentences?", [Chunk("c", "d", text)])
    assert analyse.cache_info().hits == hits + 1 and table.passages[0] is first
    assert first.spans == ((0, 39), (40, 61)) and "sentenc" in first.terms[1]


def test_a_chunk_indexed_with_its_sentences_is_not_analysed_again() -> None:
    text = "Another chunk this test alone has. Its sentences were stored."
    stored = analyse_text(text)  # as the indexer stores them, outside the cache
    misses = analyse.cache_info().misses
    table = SentenceTable.of("What was stored?", [Chunk("c", "d", text, sentences=stored)])
    assert analyse.cache_info().misses == misses and table.passages[0] is stored
