"""Span decoding (SQuAD 2.0 style) and the reader's cost model, without a model."""

from __future__ import annotations

import numpy as np
import pytest

from ragserve.read.base import ReadSpan
from ragserve.read.cost import CostSample, ReadCost
from ragserve.read.spans import best_token_span


def test_the_best_span_stays_inside_the_passage_and_ends_after_it_starts() -> None:
    start = np.array([9.0, 8.0, 0.0, 1.0, 5.0, 0.0, 0.0])  # 0: [CLS], 1: a question token
    end = np.array([1.0, 7.0, 0.0, 0.0, 0.0, 3.0, 0.0])
    span = best_token_span(start, end, passage_first=3, passage_last=6)
    assert (span.first, span.last, span.score, span.null_score) == (4, 5, 8.0, 10.0)
    # An end before the start is never chosen, however high.
    span = best_token_span(np.array([0.0, 0, 0, 5]), np.array([0.0, 0, 9, 1]), 1, 3)
    assert span.score == 9.0 and span.first <= span.last  # not 5 + 9 (start 3, end 2)


def test_the_longest_span_is_max_answer_tokens() -> None:
    start, end = np.zeros(50), np.zeros(50)
    start[2], end[40] = 10.0, 10.0
    span = best_token_span(start, end, 1, 49, max_answer_tokens=30)
    assert span.last - span.first < 30


def test_no_passage_tokens_give_an_impossible_span() -> None:
    span = best_token_span(np.ones(4), np.ones(4), 3, 2)
    assert span.score == float("-inf") and span.null_score == 2.0


def test_a_span_answers_when_its_margin_reaches_the_threshold() -> None:
    span = ReadSpan(0, 3, 7, "abcd", score=5.0, null_score=2.0)
    assert span.margin == 3.0
    assert span.answers(3.0) and not span.answers(3.5)


def test_cost_is_fitted_per_passage_and_plans_what_fits_a_budget() -> None:
    samples = [CostSample(1, 12.0), CostSample(4, 42.0), CostSample(1, 12.0), CostSample(4, 42.0)]
    cost = ReadCost.fit(samples, clock=lambda: 0.0)  # time stands still: no ageing here
    assert cost.ms_per_passage == pytest.approx(10.0)
    assert cost.overhead_ms == pytest.approx(2.0)
    assert cost.predict(3) == pytest.approx(32.0)
    assert cost.passages_within(35.0) == 3
    assert cost.passages_within(1.0) == 0
    cost.observe(2, 42.0)  # slower than predicted: rises quickly
    assert cost.ms_per_passage == pytest.approx(15.0)
    cost.observe(2, 2.0)  # faster: falls slowly
    assert cost.ms_per_passage > 10.0
    with pytest.raises(ValueError):
        ReadCost(0.0)


def test_one_slow_read_does_not_turn_the_reader_off_for_good() -> None:
    """A throttled CPU's one slow read lifts the estimate past the budget, so no read runs and no
    live timing can lower it again: the estimate ages back to the load-time figure by itself."""
    now = [0.0]
    cost = ReadCost(10.0, clock=lambda: now[0])
    assert cost.passages_within(100.0) == 10
    cost.observe(1, 5_000.0)
    assert cost.passages_within(100.0) == 0  # skipped while the CPU may still be slow
    now[0] += 300.0  # no read ran meanwhile
    assert cost.passages_within(100.0) >= 9 and cost.ms_per_passage == pytest.approx(10.0, rel=0.01)
