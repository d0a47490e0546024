"""Highlights and support: offsets into the passage text, the best sentence, the low-support flag."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from ragserve.request.evidence import highlight_passages, with_evidence
from ragserve.request.sentences import sentence_spans
from ragserve.types import Chunk, Degraded, Passage, RetrievalResult, StageTimings

BEES = Passage(
    Chunk(
        "bees#0",
        "bees",
        "  Honey bees live in colonies.  The waggle dance encodes the direction of food (relative to the sun.) "
        "The length of the waggle run encodes the distance to the food. Drones do not forage.",
    ),
    1.0,
    1,
)
TCP = Passage(Chunk("tcp#0", "tcp", "TCP opens a connection with a handshake. The client sends SYN first."), 0.5, 2)


def _text(p: Passage) -> str:
    assert p.highlight is not None
    return p.chunk.text[p.highlight.start : p.highlight.end]


def test_each_passage_gets_its_best_sentence_by_offsets() -> None:
    passages, best = highlight_passages("How does the waggle run encode distance?", [BEES, TCP])
    assert _text(passages[0]) == "The length of the waggle run encodes the distance to the food."
    assert passages[0].highlight is not None and passages[0].highlight.coverage == best == 1.0
    # The other passage holds no question word: its first sentence, with no coverage.
    assert passages[1].highlight is not None and passages[1].highlight.coverage == 0.0
    # Everything else about the passages is unchanged.
    assert [(p.chunk, p.score, p.rank) for p in passages] == [(p.chunk, p.score, p.rank) for p in (BEES, TCP)]


def test_a_closing_bracket_stays_with_its_sentence() -> None:
    text = BEES.chunk.text
    assert [text[s:e] for s, e in sentence_spans(text)][1] == (
        "The waggle dance encodes the direction of food (relative to the sun.)"
    )


@given(st.text(alphabet=st.sampled_from("ab .!?\"')(\n A1"), max_size=80))
def test_spans_are_in_order_within_the_text_and_never_empty(text: str) -> None:
    spans = sentence_spans(text)
    assert all(0 <= s < e <= len(text) and text[s:e] == text[s:e].strip() for s, e in spans)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
    # Nothing but whitespace is left out.
    covered = "".join(text[s:e] for s, e in spans)
    assert "".join(covered.split()) == "".join(text.split())


def test_support_is_low_when_no_sentence_holds_the_question() -> None:
    result = RetrievalResult([BEES, TCP], StageTimings(), Degraded(), "v1")
    asked = with_evidence("Which queen founded the hive in Prague?", result, low_support_below=0.5)
    assert asked.support is not None and asked.support.low and asked.support.coverage < 0.5
    answered = with_evidence("What does the client send in a TCP handshake?", result, low_support_below=0.5)
    assert answered.support is not None and not answered.support.low
    # The original (it may sit in a cache) is left alone.
    assert result.support is None and result.passages[0].highlight is None
