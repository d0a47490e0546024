"""Highlights and support: offsets into the passage text, the best sentence, the low-support flag."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragserve.request.evidence import EVIDENCE_RANK_PENALTY, evidence_passage, highlight_passages, with_evidence
from ragserve.request.sentences import sentence_spans
from ragserve.types import Chunk, Degraded, Highlight, Passage, RetrievalResult, StageTimings

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


def test_the_evidence_is_a_later_passages_highlight_only_when_it_covers_clearly_more() -> None:
    result = RetrievalResult([TCP, BEES], StageTimings(), Degraded(), "v1")
    asked = with_evidence("How does the waggle run encode distance?", result, low_support_below=0.2)
    assert asked.support is not None and asked.support.evidence_passage == 1  # the bees, ranked second

    def covering(*coverages: float | None) -> list[Passage]:
        return [
            Passage(TCP.chunk, 1.0, i + 1, None if c is None else Highlight(0, 3, c)) for i, c in enumerate(coverages)
        ]

    step = EVIDENCE_RANK_PENALTY
    assert evidence_passage(covering(0.5, 0.5 + step / 2)) == 0  # close: retrieval's order decides
    assert evidence_passage(covering(0.5, 0.5 + 2 * step)) == 1
    assert evidence_passage(covering(0.5, 0.5, 0.5 + 3 * step)) == 2
    assert evidence_passage(covering(None, 0.1)) == 1  # a passage with no sentence has no highlight
    assert evidence_passage([]) == 0


def test_ask_prints_the_evidence_passages_highlight_with_its_citation(capsys: pytest.CaptureFixture[str]) -> None:
    from ragserve.cli.printing import print_retrieval
    from ragserve.v1 import rag_pb2 as pb

    event = pb.RetrievalEvent(
        passages=[
            pb.Passage(doc_id="tcp", text="TCP opens a connection.", rank=1, highlight=pb.Highlight(start=0, end=3)),
            pb.Passage(
                doc_id="bees",
                text="Bees dance. The run encodes distance.",
                rank=2,
                highlight=pb.Highlight(start=12, end=37),
            ),
        ],
        support=pb.Support(coverage=0.9, evidence_passage=1),
    )
    print_retrieval(event)
    assert "evidence [2]: The run encodes distance." in capsys.readouterr().out
    print_retrieval(pb.RetrievalEvent(passages=list(event.passages)))  # an older server: no support
    assert "evidence [1]: TCP" in capsys.readouterr().out
