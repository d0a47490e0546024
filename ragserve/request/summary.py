"""How a Query ended, into its final timings and its final event: the engine's run, or the
reader's span in its place."""

from __future__ import annotations

from dataclasses import dataclass

from ragserve.events import FinalSummary, Usage
from ragserve.prompt import is_decline
from ragserve.request.answer import AnswerRun
from ragserve.request.context import FittedContext
from ragserve.types import RequestClass, RetrievalResult, StageTimings


@dataclass(slots=True)
class Outcome:
    """How the stream ended, for the final summary: the engine's run, or the reader's span in its place."""

    retrieval: RetrievalResult
    fallback: str = ""  # why the reader's span answered instead of the engine (empty: it did not)
    fallback_ms: float = 0.0  # when the reader's span went out as the answer


def record_answer(timings: StageTimings, run: AnswerRun, outcome: Outcome) -> None:
    """The generation's times into the request's final timings (all counted from the request's start)."""
    timings.generation_ms = run.ended_ms - run.started_ms
    timings.ttft_ms = run.first_token_ms or outcome.fallback_ms
    timings.time_per_output_token_ms = run.time_per_output_token_ms()
    timings.total_ms = run.ended_ms


def final_summary(
    outcome: Outcome,
    run: AnswerRun,
    timings: StageTimings,
    model_id: str,
    context: FittedContext,
    request_class: RequestClass,
) -> FinalSummary:
    degraded = outcome.retrieval.degraded
    if outcome.fallback:
        degraded = degraded.noted(outcome.fallback)
    return FinalSummary(
        run.usage if not outcome.fallback else Usage(0, 0, 0),
        timings,
        degraded,
        "reader" if outcome.fallback else run.finish_reason,
        model_id,
        context_tokens=context.tokens,
        context_tokens_full=context.tokens_full,
        request_class=request_class,
        declined=not outcome.fallback and run.finish_reason == "stop" and is_decline(run.text),
    )
