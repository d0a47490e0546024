"""The decline before the generator: its signals, its model, its threshold, the setting."""

from __future__ import annotations

import time

import pytest

from ragserve.config import AnswerSettings, EmbedderSettings, Settings
from ragserve.factory.pipeline import make_decline
from ragserve.request.decline import SHIPPED_MODEL, SIGNALS, Decline, DeclineModel, judge, signals_of
from ragserve.request.sentences import SentenceTable
from ragserve.types import Chunk, Degraded, Passage, RetrievalResult, StageTimings, Support

QUESTION = "When did the Normans conquer England?"


def _result(question: str, texts: list[str], dense: list[float | None], lexical: list[float | None]) -> tuple:
    passages = [
        Passage(Chunk(f"c{i}", f"d{i}", text), 1.0 - i / 10, i + 1, dense=d, lexical=b)
        for i, (text, d, b) in enumerate(zip(texts, dense, lexical, strict=True))
    ]
    table = SentenceTable.of(question, [p.chunk for p in passages])
    result = RetrievalResult(passages, StageTimings(), Degraded(), "v1", support=Support(0.5, False))
    return result, table


def _covered() -> tuple:
    return _result(
        QUESTION,
        ["The Normans conquered England in 1066.", "Normandy is a region in France.", "William was a duke."],
        [0.71, 0.52, 0.40],
        [12.0, 6.0, None],
    )


def _absent() -> tuple:
    return _result(
        QUESTION,
        ["Solar panels convert light.", "Photovoltaic cells are made of silicon.", "Energy is stored."],
        [0.18, 0.17, None],
        [None, 0.8, 0.4],
    )


def _model(**over: object) -> DeclineModel:
    data = {
        "names": ["top_dense", "found"],
        "mean": [0.5, 0.6],
        "std": [0.2, 0.3],
        "weights": [-2.0, -1.5],
        "bias": 0.0,
        "calibration": [[0.01, 0.9], [0.05, 0.5], [0.1, 0.3]],
        "embedder": "m",
    }
    return DeclineModel.from_json({**data, **over})


def test_each_signal_reads_retrieval_and_the_sentence_table() -> None:
    covered, table = _covered()
    values = signals_of(covered, table, tuple(SIGNALS))
    assert values is not None
    assert values["top_dense"] == pytest.approx(0.71) and values["dense_drop"] == pytest.approx(0.19)
    assert values["coverage"] == 0.5 and values["found"] == pytest.approx(1.0) and values["missing_terms"] == 0
    absent, table = _absent()
    values = signals_of(absent, table, tuple(SIGNALS))
    assert values is not None and values["found"] == 0.0 and values["missing_terms"] >= 3


def test_a_signal_that_cannot_be_measured_leaves_the_question_answered() -> None:
    absent, table = _result(QUESTION, ["Solar panels convert light."], [None], [0.5])  # BM25 only: no cosine
    assert signals_of(absent, table, ("top_dense",)) is None
    assert Decline(_model(), 0.0).judge(absent, table) is None


def test_the_decision_declines_a_question_the_passages_do_not_cover_and_says_why() -> None:
    decline = Decline.at(_model(), 0.05)
    assert decline is not None and decline.threshold == 0.5
    assert decline.judge(*_covered()) is None
    evidence = decline.judge(*_absent())
    assert evidence is not None and evidence.score >= evidence.threshold == 0.5
    assert set(evidence.signals) == {"top_dense", "found"} and evidence.signals["top_dense"] == pytest.approx(0.18)


def test_the_threshold_follows_the_calibration_table_and_zero_turns_it_off() -> None:
    model = _model()
    assert model.threshold_for(0.001) == 0.9 and model.threshold_for(0.5) == 0.3
    assert model.threshold_for(0.03) == pytest.approx(0.7)
    assert Decline.at(model, 0.0) is None and judge(None, *_absent()) is None


@pytest.mark.parametrize(
    "bad",
    [{"names": ["nope"], "mean": [0], "std": [1], "weights": [1]}, {"std": [0.0, 1.0]}, {"calibration": []}],
)
def test_a_model_that_does_not_fit_the_signals_is_refused(bad: dict) -> None:
    with pytest.raises(ValueError):
        _model(**bad)


def test_the_decision_takes_well_under_a_millisecond() -> None:
    decline = Decline(DeclineModel.load(), 0.5)
    result, table = _covered()
    started = time.perf_counter()
    for _ in range(200):
        decline.judge(result, table)
    assert (time.perf_counter() - started) / 200 < 0.5e-3


def test_the_shipped_model_loads_and_names_the_default_embedder() -> None:
    model = DeclineModel.load(SHIPPED_MODEL)
    assert model.embedder == EmbedderSettings().model
    assert all(0.0 < t < 1.0 for _, t in model.calibration)


def test_one_setting_picks_the_threshold_and_zero_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGSERVE_DECLINE_FALSE_RATE", "0.05")
    settings = Settings()
    decline = make_decline(settings)
    assert decline is not None and decline.threshold == DeclineModel.load().threshold_for(0.05)
    assert make_decline(Settings(answer=AnswerSettings(decline_false_rate=0.0))) is None
    other = Settings(embedder=EmbedderSettings(model="another/embedder"))
    assert make_decline(other) is None  # its cosines are on another scale


def test_ragserve_ask_prints_why_the_server_declined(capsys: pytest.CaptureFixture[str]) -> None:
    from ragserve.cli.printing import print_final
    from ragserve.v1 import rag_pb2 as pb

    evidence = pb.DeclineEvidence(score=0.97, threshold=0.7, signals={"top_dense": 0.2, "found": 0.1})
    print_final(pb.FinalEvent(finish_reason="abstained", declined=True, decline_evidence=evidence), 0.01)
    printed = capsys.readouterr().out
    assert "decline: score 0.970 >= threshold 0.700 (found 0.100, top_dense 0.200)" in printed
    print_final(pb.FinalEvent(finish_reason="stop"), 0.01)
    assert "decline:" not in capsys.readouterr().out
