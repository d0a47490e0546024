"""A Query's events once its prompt is with the engine: the retrieval event, the tokens, the reader's
span (with the retrieval event when it is done by the first token, else as one later event between
the tokens), and the answers given without the engine (declined, or the reader's span when the
engine cannot answer)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ragserve.budget import RequestContext
from ragserve.cache.base import CachedAnswer
from ragserve.errors import DeadlineExpired, Overloaded, RagError, Unavailable
from ragserve.prompt import Prompt, build_prompt, is_decline
from ragserve.request.answer import AnswerRun, AnswerStream
from ragserve.request.caches import replay
from ragserve.request.context import FittedContext, fit_context
from ragserve.request.evidence import with_answer
from ragserve.request.policy import ABSTAIN_ANSWER, AnswerPolicy
from ragserve.request.sentences import SentenceTable
from ragserve.types import (
    AnswerSpan,
    FinalSummary,
    LateAnswer,
    Passage,
    QueryEvent,
    RequestClass,
    RetrievalResult,
    StageTimings,
    TokenDelta,
    Turn,
    Usage,
)

# What the reader's task gives: its span (or None), its ms, why it did not run ("" when it did).
Reading = asyncio.Task[tuple[AnswerSpan | None, float, str]]


@dataclass(slots=True)
class Outcome:
    """How the stream ended, for the final summary: the engine's run, or the reader's span in its place."""

    retrieval: RetrievalResult
    fallback: str = ""  # why the reader's span answered instead of the engine (empty: it did not)
    fallback_ms: float = 0.0  # when the reader's span went out as the answer
    reader_ms: float | None = None  # the reader's time, when it ran beside the engine


class BatchShare:
    """Batch's share of the engine: a batch request holds one of its slots while it generates and
    waits for one within its deadline (DEADLINE_EXCEEDED past it); interactive requests pass
    straight through, so they never wait for batch work. `seqs` 0: no cap."""

    def __init__(self, seqs: int) -> None:
        self._slots = asyncio.Semaphore(seqs) if seqs > 0 else None

    @contextlib.asynccontextmanager
    async def hold(self, request: RequestContext) -> AsyncIterator[None]:
        slots = self._slots
        if slots is None or request.interactive:
            yield
            return
        with request.stage("engine_wait"):
            try:
                async with asyncio.timeout_at(request.deadline.client_end(asyncio.get_running_loop())):
                    await slots.acquire()
            except TimeoutError as exc:
                raise DeadlineExpired("the deadline passed while batch work waited for the generator") from exc
        try:
            yield
        finally:
            slots.release()


@dataclass(slots=True)
class ReaderStart:
    """When a Query's reader starts: beside the engine's prefill (its span can go with the retrieval
    event), or once the first token is out (it never takes CPU from the prefill). `start` makes the
    task (None: no reader, or it has read already)."""

    start: Callable[[bool], Reading] | None = None  # its argument: read the top passage whatever the budget
    beside_prefill: bool = False
    highlight: bool = False  # a span that answers becomes the highlight shown

    def begin(self, at_least_one: bool = False) -> Reading | None:
        return self.start(at_least_one) if self.start is not None else None


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
                retrieval = _read_into(question, retrieval, reading, outcome, reader.highlight)
                reading = None
        outcome.retrieval = retrieval
        yield retrieval
        tokens = 0
        try:
            async for delta in answer.deltas(deadline_at):
                if reading is not None and reading.done():
                    for late in _late(reading, outcome):
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
            for late in await finish_reading(reading, deadline_at, outcome):
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
            for late in _late(reading, outcome):
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
    outcome: Outcome | None = None
    deadline_at = request.deadline.client_end(asyncio.get_running_loop())
    try:
        for event in replay(cached, request.timings, request.deadline.elapsed_ms, index_identity):
            if isinstance(event, RetrievalResult):
                event = evidence(event)
                outcome = Outcome(event)
                yield event
                reading = reader_for(event).begin()
                continue
            if isinstance(event, FinalSummary) and reading is not None and outcome is not None:
                for late in await finish_reading(reading, deadline_at, outcome):
                    yield late
                reading = None
                event.timings.reader_ms = outcome.reader_ms or 0.0
            yield event
    finally:
        if reading is not None and not reading.done():
            reading.cancel()  # the caller left


async def finish_reading(reading: Reading, deadline_at: float | None, outcome: Outcome) -> list[LateAnswer]:
    """A read still running once the text is out: waited for within the deadline (its span goes
    before the final event), else cancelled."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout_at(deadline_at):
            await asyncio.wait({reading})
    if reading.done():
        return _late(reading, outcome)
    reading.cancel()
    return []


def fallback_text(span: AnswerSpan, passage_text: str) -> str:
    """The reader's answer in words: the span, and the sentence it stands in."""
    sentence = passage_text[span.sentence_start : span.sentence_end].strip()
    return f'{span.text} (passage [{span.passage + 1}]: "{sentence}")'


def _read_into(
    question: str, retrieval: RetrievalResult, reading: Reading, outcome: Outcome, highlight: bool
) -> RetrievalResult:
    span, ms, not_read = _result(reading)
    retrieval.timings.reader_ms = outcome.reader_ms = ms
    if not_read:
        return retrieval
    return with_answer(question, retrieval, span, highlight)


def _late(reading: Reading, outcome: Outcome) -> list[LateAnswer]:
    """The reader's late event, when it ran (a read skipped for lack of time sends none)."""
    span, ms, not_read = _result(reading)
    outcome.reader_ms = ms
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
    retrieval: RetrievalResult, timings: StageTimings, model_id: str, elapsed_ms: Callable[[], float]
) -> list[QueryEvent]:
    """The documents do not answer the question (low support, or the reader found no answer): say so
    without calling the engine."""
    timings.ttft_ms = timings.total_ms = elapsed_ms()
    return [
        retrieval,
        TokenDelta(ABSTAIN_ANSWER),
        FinalSummary(Usage(0, 0, 0), timings, retrieval.degraded, "abstained", model_id, declined=True),
    ]


class CountsTokens(Protocol):
    """What fitting the context needs of a generator: its tokenizer's count (the training data
    preparation fits prompts with the renderer alone, no engine)."""

    def count_tokens(self, text: str) -> int: ...


def fit_and_build(
    policy: AnswerPolicy,
    question: str,
    passages: list[Passage],
    table: SentenceTable,
    budget: int,
    generator: CountsTokens,
    request: RequestContext,
    span: AnswerSpan | None = None,
    warm_top: bool = False,
    history: tuple[Turn, ...] = (),
) -> tuple[FittedContext, Prompt]:
    """The passages fitted to the context budget, and the prompt. Off the event loop: a tokenizer
    call per sentence (and more at a large top_k) would stall every other stream while it runs.
    `warm_top`: warming pre-filled the top passage; `history`: the turns quoted before the question."""
    with request.stage("context"):
        context = fit_context(question, passages, budget, generator.count_tokens, policy.whole_first_max_tokens, table)
    with request.stage("prompt"):
        key = key_sentence(span, passages, context.passages) if policy.reader_lead else None
        layout = policy.prompt_layout
        whole_top = bool(passages and context.passages) and context.passages[0].chunk == passages[0].chunk
        if layout == "reusable" and not whole_top:
            layout = "stable"  # a top passage cut to the question is shared with no other question
        prompt = build_prompt(question, context.passages, layout, key, warm_top, history)
    return context, prompt


def key_sentence(span: AnswerSpan | None, read: list[Passage], kept: list[Passage]) -> tuple[int, str] | None:
    """The sentence holding a span that answers, with its passage's number in the prompt (None when
    there is no such span or its passage did not fit the context)."""
    if span is None or not span.answers or span.passage >= len(read):
        return None
    chunk = read[span.passage].chunk
    number = next((n for n, p in enumerate(kept, start=1) if p.chunk.chunk_id == chunk.chunk_id), None)
    return None if number is None else (number, chunk.text[span.sentence_start : span.sentence_end])


def record_answer(timings: StageTimings, run: AnswerRun, outcome: Outcome) -> None:
    """The generation's times into the request's final timings (all counted from the request's start)."""
    timings.generation_ms = run.ended_ms - run.started_ms
    timings.ttft_ms = run.first_token_ms or outcome.fallback_ms
    timings.time_per_output_token_ms = run.time_per_output_token_ms()
    timings.total_ms = run.ended_ms
    if outcome.reader_ms is not None:
        timings.reader_ms = outcome.reader_ms


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
