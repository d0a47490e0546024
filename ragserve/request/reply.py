"""A Query's events once its prompt is with the engine: the retrieval event, the tokens, the reader's
span (with the retrieval event when it is done by the first token, else as one later event between
the tokens), and the answers given without the engine (declined, or the reader's span when the
engine cannot answer)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any

from ragserve.budget import RequestContext
from ragserve.cache.base import CachedAnswer
from ragserve.errors import Overloaded, RagError, Unavailable
from ragserve.events import DeclineEvidence, FinalSummary, LateAnswer, QueryEvent, TokenDelta, Usage
from ragserve.request.answer import AnswerStream
from ragserve.request.caches import replay
from ragserve.request.evidence import with_answer
from ragserve.request.policy import ABSTAIN_ANSWER
from ragserve.request.reading import ReadingStage
from ragserve.request.summary import Outcome
from ragserve.types import AnswerSpan, RetrievalResult, StageTimings

# What the reader's task gives: its span (or None), its ms, why it did not run ("" when it did).
Reading = asyncio.Task[tuple[AnswerSpan | None, float, str]]


@dataclass(slots=True)
class ReaderStart:
    """When a Query's reader starts: beside the engine's prefill (its span can go with the retrieval
    event), or once the first token is out (it never takes CPU from the prefill). `start` makes the
    task (None: no reader, or it has read already)."""

    start: Callable[[bool], Reading] | None = None  # its argument: read the top passage whatever the budget
    beside_prefill: bool = False
    highlight: bool = False  # a span that answers becomes the highlight shown
    # The request's timings, where the read records its time (request/reading.py): an event sent
    # after the read shows it.
    timings: StageTimings | None = None

    def begin(self, at_least_one: bool = False) -> Reading | None:
        return self.start(at_least_one) if self.start is not None else None


def reader_start(
    stage: ReadingStage | None, question: str, retrieval: RetrievalResult, request: RequestContext
) -> ReaderStart:
    """The reader for this Query (none when it is off or has read already)."""
    if stage is None or retrieval.answer is not None or not retrieval.passages:
        return ReaderStart()

    def start(at_least_one: bool = False) -> Reading:  # the task inherits this request's class
        passages, identity = retrieval.passages, retrieval.index_identity
        read = stage.read(question, passages, identity, stage.budget_ms, request, at_least_one)
        return asyncio.ensure_future(read)

    return ReaderStart(start, stage.beside_prefill, stage.highlight, request.timings)


async def stream_answer(
    question: str,
    answer: AnswerStream,
    retrieval: RetrievalResult,
    reader: ReaderStart,
    deadline_at: float | None,
    outcome: Outcome,
) -> AsyncGenerator[QueryEvent, None]:
    """The retrieval event, then the tokens, the reader's span among them; the first token never
    waits for the reader. When the engine fails before its first token and the reader's span
    answers, that span and its sentence are the answer, flagged degraded."""
    reading = reader.begin() if reader.beside_prefill else None
    try:
        if reading is not None:
            either: set[asyncio.Future[Any]] = {reading, answer.first_step}
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            if reading.done():
                retrieval = _read_into(question, retrieval, reading, reader)
                reading = None
        outcome.retrieval = retrieval
        yield retrieval
        tokens = 0
        try:
            async for delta in answer.deltas(deadline_at):
                if reading is not None and reading.done():
                    for late in _late(reading):
                        yield late
                    reading = None
                tokens += 1
                yield delta
                if tokens == 1 and not reader.beside_prefill:
                    reading = reader.begin()
        except (Unavailable, Overloaded) as exc:
            if tokens:
                raise
            async for event in _reader_instead(exc, retrieval, reader, reading, deadline_at, outcome, answer):
                yield event
            reading = None  # _reader_instead consumed (or cancelled) it
            return
        if reading is not None:  # done after the last token: still before the final event
            for late in await finish_reading(reading, deadline_at):
                yield late
            reading = None
    finally:
        if reading is not None and not reading.done():
            reading.cancel()  # the caller left: the reader's work is no one's any more


async def _reader_instead(
    exc: RagError,
    retrieval: RetrievalResult,
    reader: ReaderStart,
    reading: Reading | None,
    deadline_at: float | None,
    outcome: Outcome,
    answer: AnswerStream,
) -> AsyncGenerator[QueryEvent, None]:
    """The engine failed before its first token: the reader's span and its sentence are the answer
    when it answers (read now if it has not, the top passage at least); else `exc` goes on up."""
    try:
        if reading is None and retrieval.answer is None:
            reading = reader.begin()
        span = await _span_of(retrieval, reading, deadline_at)
        if span is None and retrieval.answer is None and reader.start is not None:
            # Skipped for lack of time: with no engine, the top passage's read is the only answer.
            reading = reader.begin(at_least_one=True)
            span = await _span_of(retrieval, reading, deadline_at)
        passage = retrieval.passages[span.passage] if span is not None and span.answers else None
        if span is None or passage is None:
            raise exc
        outcome.fallback = f"the generator could not answer ({exc}); the reader's span is the answer"
        if reading is not None:
            for late in _late(reading):
                yield late
        outcome.fallback_ms = answer.elapsed_ms()
        yield TokenDelta(fallback_text(span, passage.chunk.text))
    finally:
        if reading is not None and not reading.done():
            reading.cancel()


async def replay_answer(
    cached: CachedAnswer,
    index_identity: str,
    request: RequestContext,
    evidence: Callable[[RetrievalResult], RetrievalResult],
    reader_for: Callable[[RetrievalResult], ReaderStart],
) -> AsyncGenerator[QueryEvent, None]:
    """An answer-cache hit, the engine not asked: the passages the answer cites with this question's
    evidence, the text, and the reader's span for this question before the final event (it reads
    once the passages are out, so the text never waits for it). `index_identity`: the serving index
    the hit was found under, which its reading is kept under."""
    reading: Reading | None = None
    deadline_at = request.deadline.client_end(asyncio.get_running_loop())
    try:
        for event in replay(cached, request.timings, request.deadline.elapsed_ms, index_identity):
            if isinstance(event, RetrievalResult):
                event = evidence(event)
                yield event
                reading = reader_for(event).begin()
                continue
            if isinstance(event, FinalSummary) and reading is not None:
                for late in await finish_reading(reading, deadline_at):
                    yield late
                reading = None
                event.timings.reader_ms = request.timings.reader_ms  # the snapshot, after the read
            yield event
    finally:
        if reading is not None and not reading.done():
            reading.cancel()  # the caller left


async def finish_reading(reading: Reading, deadline_at: float | None) -> list[LateAnswer]:
    """A read still running once the text is out: waited for within the deadline (its span goes
    before the final event), else cancelled."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout_at(deadline_at):
            await asyncio.wait({reading})
    if reading.done():
        return _late(reading)
    reading.cancel()
    return []


def fallback_text(span: AnswerSpan, passage_text: str) -> str:
    """The reader's answer in words: the span, and the sentence it stands in."""
    sentence = passage_text[span.sentence_start : span.sentence_end].strip()
    return f'{span.text} (passage [{span.passage + 1}]: "{sentence}")'


def _read_into(question: str, retrieval: RetrievalResult, reading: Reading, reader: ReaderStart) -> RetrievalResult:
    span, _, not_read = _result(reading)
    if reader.timings is not None:  # the retrieval event's snapshot, taken before the read ended
        retrieval.timings.reader_ms = reader.timings.reader_ms
    if not_read:
        return retrieval
    return with_answer(question, retrieval, span, reader.highlight)


def _late(reading: Reading) -> list[LateAnswer]:
    """The reader's late event, when it ran (a read skipped for lack of time sends none)."""
    span, ms, not_read = _result(reading)
    return [] if not_read else [LateAnswer(span, ms)]


def _result(reading: Reading) -> tuple[AnswerSpan | None, float, str]:
    if reading.cancelled() or reading.exception() is not None:
        return None, 0.0, "reader cancelled"
    return reading.result()


async def _span_of(retrieval: RetrievalResult, reading: Reading | None, deadline_at: float | None) -> AnswerSpan | None:
    if reading is None:
        return retrieval.answer
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout_at(deadline_at):
            await asyncio.wait({reading})
    return _result(reading)[0] if reading.done() else None


def declined(
    retrieval: RetrievalResult,
    timings: StageTimings,
    model_id: str,
    elapsed_ms: Callable[[], float],
    evidence: DeclineEvidence | None = None,
) -> list[QueryEvent]:
    """The documents do not answer the question (the decline's model, low support, or the reader
    found no answer): say so without calling the engine. `evidence`: the decline's, when it decided."""
    timings.ttft_ms = timings.total_ms = elapsed_ms()
    final = FinalSummary(
        Usage(0, 0, 0), timings, retrieval.degraded, "abstained", model_id, declined=True, decline_evidence=evidence
    )
    return [retrieval, TokenDelta(ABSTAIN_ANSWER), final]
