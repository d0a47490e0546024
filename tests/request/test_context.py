"""Fitting passages into the context token budget: which sentences stay, and what never changes."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from ragserve.request.context import GAP, fit_context
from ragserve.request.sentences import content_terms, split_sentences
from ragserve.types import Chunk, Passage


def _words(text: str) -> int:
    # A stand-in tokenizer: one token per whitespace-separated word.
    return len(text.split())


def _passage(n: int, text: str) -> Passage:
    return Passage(Chunk(f"doc{n}#0", f"doc{n}", text, title=f"Doc {n}"), score=1.0 / n, rank=n)


BEES = _passage(
    1,
    "Honey bees live in colonies. A forager returns to the hive with nectar. "
    "The waggle dance encodes the direction of food relative to the sun. "
    "The length of the waggle run encodes the distance. Drones do not forage.",
)
TCP = _passage(
    2,
    "TCP opens a connection with a three-way handshake. The client sends SYN. "
    "The server answers SYN-ACK. The client confirms with ACK.",
)
# The prompt renders each passage's title: "Doc 1" and "Doc 2" count against the budget.
TITLES = _words("Doc 1") + _words("Doc 2")


def test_sentences_split_at_sentence_ends_only() -> None:
    assert split_sentences("Dr. Smith came. He left at 3.5 p.m. Then it rained!") == [
        "Dr. Smith came.",
        "He left at 3.5 p.m.",
        "Then it rained!",
    ]


def test_terms_drop_question_words_and_stem() -> None:
    assert content_terms("What does the waggle dance encode?") == {"waggl", "danc", "encod"}


def test_zero_budget_keeps_whole_passages() -> None:
    fitted = fit_context("How does the waggle dance encode distance?", [BEES, TCP], 0, _words)
    assert fitted.passages == [BEES, TCP]
    assert fitted.tokens == fitted.tokens_full == TITLES + _words(BEES.chunk.text) + _words(TCP.chunk.text)


def test_budget_keeps_the_matching_sentences_within_budget() -> None:
    fitted = fit_context("How does the waggle dance encode distance?", [BEES, TCP], 40, _words)
    bees, tcp = (p.chunk.text for p in fitted.passages)
    assert "The length of the waggle run encodes the distance." in bees
    assert "The waggle dance encodes the direction of food relative to the sun." in bees
    assert "Drones do not forage" not in bees
    assert bees.startswith(GAP)  # a gap before the kept sentences is marked
    assert fitted.tokens <= 40 < fitted.tokens_full
    assert fitted.tokens == TITLES + sum(_words(p.chunk.text) for p in fitted.passages)
    # Every passage keeps a sentence, its id, rank, score and title: citations stay valid.
    assert tcp.strip(GAP + " ")
    assert [(p.chunk.chunk_id, p.rank, p.score, p.chunk.title) for p in fitted.passages] == [
        (p.chunk.chunk_id, p.rank, p.score, p.chunk.title) for p in (BEES, TCP)
    ]


def test_kept_sentences_stay_in_document_order() -> None:
    fitted = fit_context("distance and direction of the sun for the waggle", [BEES], 30, _words)
    text = fitted.passages[0].chunk.text
    assert text.index("direction") < text.index("distance")


def test_a_budget_smaller_than_any_sentence_keeps_the_numbering() -> None:
    fitted = fit_context("waggle dance", [BEES, TCP], TITLES + 4, _words)
    assert len(fitted.passages) == 2
    assert fitted.tokens <= TITLES + 4
    assert all(p.chunk.text == GAP for p in fitted.passages)


def test_a_long_title_uses_the_budget_it_takes_in_the_prompt() -> None:
    long_title = replace(BEES, chunk=replace(BEES.chunk, title="On the " + "very " * 20 + "long study of bees"))
    question = "How does the waggle dance encode distance?"
    short, long = fit_context(question, [BEES], 30, _words), fit_context(question, [long_title], 30, _words)
    assert long.tokens_full == short.tokens_full + _words(long_title.chunk.title) - _words("Doc 1")
    assert short.tokens <= 30 and long.tokens <= 30
    # The title's tokens leave fewer for the passage's sentences.
    assert _words(long.passages[0].chunk.text) < _words(short.passages[0].chunk.text)
    assert long.passages[0].chunk.title == long_title.chunk.title  # counted, never cut


def test_a_passage_without_a_title_counts_its_document_id() -> None:
    untitled = replace(TCP, chunk=replace(TCP.chunk, title=""))
    fitted = fit_context("handshake", [untitled], 0, _words)
    assert fitted.tokens == _words("doc2") + _words(TCP.chunk.text)  # build_prompt renders title="doc2"


def test_titles_alone_over_the_budget_are_kept_and_every_passage_is_a_gap() -> None:
    fitted = fit_context("waggle dance", [BEES, TCP], 3, _words)
    assert [p.chunk.text for p in fitted.passages] == [GAP, GAP]
    assert [p.chunk.title for p in fitted.passages] == ["Doc 1", "Doc 2"]
    assert fitted.tokens == TITLES + 2


def test_the_input_passages_are_not_modified() -> None:
    before = BEES.chunk.text
    fit_context("waggle dance distance", [BEES], 10, _words)
    assert BEES.chunk.text == before


@given(budget=st.integers(min_value=2, max_value=80), question=st.text(max_size=40))
def test_the_budget_is_never_exceeded(budget: int, question: str) -> None:
    fitted = fit_context(question, [BEES, TCP], budget, _words)
    # Titles are never cut: under their own size, only one gap marker a passage is added.
    assert fitted.tokens <= max(budget, TITLES + 2)
    assert [p.chunk.chunk_id for p in fitted.passages] == ["doc1#0", "doc2#0"]


def test_reusable_layout_keeps_the_top_passage_whole_whatever_the_question() -> None:
    budget = TITLES + 12
    fits = {
        question: fit_context(question, [BEES, TCP], budget, _words, whole_first_max_tokens=100)
        for question in ("How does the waggle dance encode distance?", "What does the client send first in TCP?")
    }
    for context in fits.values():
        # The same text for both questions: its KV can be reused. The budget left after the top
        # passage is spent on the rest; here none is left, and a passage with nothing quoted is left out.
        assert context.passages == [BEES]
        assert context.tokens == _words("Doc 1") + _words(BEES.chunk.text)
        assert context.tokens_full == TITLES + _words(BEES.chunk.text) + _words(TCP.chunk.text)
    roomy_budget = TITLES + _words(BEES.chunk.text) + 12
    roomy = fit_context(
        "What does the client send first?", [BEES, TCP], roomy_budget, _words, whole_first_max_tokens=100
    )
    assert roomy.passages[0] == BEES and roomy.passages[1].chunk.text.startswith(GAP)
    # A top passage longer than the cap is cut to the question like the others.
    cut = fit_context(
        "How does the waggle dance encode distance?", [BEES, TCP], budget + 10, _words, whole_first_max_tokens=5
    )
    assert cut.passages[0].chunk.text != BEES.chunk.text and "waggle" in cut.passages[0].chunk.text
    assert cut.tokens <= budget + 10


class _WordCounter:
    """A named stand-in for the generator: fit_and_build only counts tokens with it (one a word)."""

    def count_tokens(self, text: str) -> int:
        return _words(text)


def test_the_prompt_marks_the_top_passage_as_shared_only_when_it_went_in_whole() -> None:
    """Only a top passage quoted whole is shared with the next question about it (and, warm, worth a
    pad to a KV block: generate/rendering.py); one cut to the question is laid out as the stable layout."""
    from ragserve.budget import Deadline, RequestContext
    from ragserve.request.policy import AnswerPolicy
    from ragserve.request.prompting import fit_and_build
    from ragserve.request.sentences import SentenceTable

    question = "How does the waggle dance encode distance?"
    table = SentenceTable.of(question, [BEES.chunk, TCP.chunk])

    def prompt(whole_max: int):  # type: ignore[no-untyped-def]
        policy = AnswerPolicy(prompt_layout="reusable", whole_passage_max_tokens=whole_max)
        request = RequestContext(Deadline(10_000))
        counter = _WordCounter()
        return fit_and_build(policy, question, [BEES, TCP], table, TITLES + 12, counter, request, None, True)  # type: ignore[arg-type]

    context, whole = prompt(100)
    assert context.passages[0] == BEES
    assert whole.user[: whole.reuse_end].endswith(f"{BEES.chunk.text}\n</passage>\n") and whole.warmed
    context, cut = prompt(5)
    assert context.passages[0] != BEES and cut.reuse_end == 0 and not cut.warmed
