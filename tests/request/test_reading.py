"""The reader on the request path, with the real embedder and index and a reader and generator that
are fakes (named as such): where its span travels, that it never holds the first token, abstention,
the degraded answer when the engine cannot answer, and what is kept between requests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ragserve.budget import Deadline, RequestContext
from ragserve.cache.base import AnswerCache
from ragserve.config import CacheSettings, ReaderSettings
from ragserve.embed.torch_backend import SentenceTransformerEmbedder
from ragserve.errors import Unavailable
from ragserve.events import FinalSummary, GenerationChunk, LateAnswer, QueryEvent, TokenDelta, Usage
from ragserve.factory import assemble_pipeline, make_answer_cache
from ragserve.index.hnsw import HnswIndex
from ragserve.prompt import Prompt
from ragserve.read.base import ReadSpan
from ragserve.request.pipeline import RagPipeline
from ragserve.request.policy import ABSTAIN_ANSWER, AnswerPolicy
from ragserve.types import GenerateParams, RetrievalResult, RetrieveParams
from tests.fakes import FakeGenerator, FakeGeneratorBase, FakeReader

QUESTION = "Who discovered penicillin?"
ANSWER = "Alexander Fleming"


class FakeDownGenerator(FakeGeneratorBase):
    """A generator whose every stream fails before its first token (no server up)."""

    def __init__(self) -> None:
        self.calls = 0

    async def stream(self, prompt: Prompt, params: GenerateParams, trace_id: str) -> AsyncIterator[GenerationChunk]:
        self.calls += 1
        raise Unavailable("no generation server is up")
        yield  # pragma: no cover (an async generator)


@pytest.fixture
def make(sample_index: Path, embedder: SentenceTransformerEmbedder):
    executor = ThreadPoolExecutor(2)

    def build(
        generator: object,
        reader: FakeReader,
        answers: AnswerCache | None = None,
        policy: AnswerPolicy | None = None,
        **reading: object,
    ) -> RagPipeline:
        index = HnswIndex.load(sample_index)
        settings = ReaderSettings(**reading)  # type: ignore[arg-type]
        return assemble_pipeline(
            embedder,
            index,
            generator,
            executor,
            reader=reader,
            reading=settings,
            answers=answers,
            policy=policy,  # type: ignore[arg-type]
        )

    yield build
    executor.shutdown()


def _ask(pipeline: RagPipeline, question: str = QUESTION) -> list[QueryEvent]:
    async def run() -> list[QueryEvent]:
        params = RetrieveParams(question, top_k=3, budget_ms=10_000)
        request = RequestContext(Deadline(10_000, client_timeout_s=30), "r")
        return [e async for e in pipeline.query(params, GenerateParams(8, 0.5), request)]

    return asyncio.run(run())


def test_a_reader_done_before_the_first_token_sends_its_span_with_the_retrieval_event(make) -> None:
    reader = FakeReader(ANSWER)
    generator = FakeGenerator(["Fleming."], delay_s=0.3, usage=Usage(10, 1, 0))
    events = _ask(make(generator, reader, start="prefill", highlight=True))
    retrieval = events[0]
    assert isinstance(retrieval, RetrievalResult) and retrieval.answer is not None
    span = retrieval.answer
    passage = retrieval.passages[span.passage]
    assert span.answers and passage.chunk.text[span.start : span.end] == ANSWER
    # The evidence shown is the sentence holding the span.
    assert retrieval.support is not None and retrieval.support.evidence_passage == span.passage
    assert passage.highlight is not None
    assert (passage.highlight.start, passage.highlight.end) == (span.sentence_start, span.sentence_end)
    assert ANSWER in passage.chunk.text[span.sentence_start : span.sentence_end]
    assert not any(isinstance(e, LateAnswer) for e in events)
    final = events[-1]
    # The read recorded its time once: the retrieval event's snapshot and the final summary agree.
    assert isinstance(final, FinalSummary) and final.timings.reader_ms > 0
    assert retrieval.timings.reader_ms == final.timings.reader_ms


def test_a_slow_reader_never_holds_the_first_token_and_comes_later(make) -> None:
    reader = FakeReader(ANSWER, delay_s=0.4)
    events = _ask(make(FakeGenerator(["Alexander", "Fleming", "did."], delay_s=0.2), reader, start="prefill"))
    kinds = [type(e).__name__ for e in events]
    assert kinds[0] == "RetrievalResult" and events[0].answer is None  # type: ignore[union-attr]
    assert kinds[1] == "TokenDelta"  # the first token did not wait for the reader
    late = [e for e in events if isinstance(e, LateAnswer)]
    assert len(late) == 1 and late[0].answer is not None and late[0].answer.text == ANSWER
    assert kinds.index("LateAnswer") < kinds.index("FinalSummary")
    final = events[-1]
    assert isinstance(final, FinalSummary) and final.timings.reader_ms == late[0].reader_ms >= 400


def test_on_a_shared_host_the_reader_starts_after_the_first_token(make) -> None:
    class CountingGenerator(FakeGenerator):
        """Notes how many reads had started when each token was made."""

        def __init__(self, reader: FakeReader) -> None:
            super().__init__(["Alexander", "Fleming", "did", "it."], delay_s=0.15)
            self.reader, self.reads_at_token = reader, []

        async def stream(self, prompt, params, trace_id):  # type: ignore[no-untyped-def]
            async for chunk in super().stream(prompt, params, trace_id):
                self.reads_at_token.append(len(self.reader.reads))
                yield chunk

    reader = FakeReader(ANSWER)
    generator = CountingGenerator(reader)
    events = _ask(make(generator, reader, start="first_token"))
    assert events[0].answer is None  # type: ignore[union-attr]
    assert generator.reads_at_token[0] == 0  # the prefill and first token had the CPUs to themselves
    kinds = [type(e).__name__ for e in events]
    assert kinds.index("TokenDelta") < kinds.index("LateAnswer") < kinds.index("FinalSummary")
    # The lexical highlight stays (RAGSERVE_READER_HIGHLIGHT is off); the span has its own sentence.
    late = next(e for e in events if isinstance(e, LateAnswer))
    assert late.answer is not None and late.answer.text == ANSWER


def test_the_reader_may_decline_without_calling_the_generator(make) -> None:
    generator = FakeGenerator(["Invented."])
    reader = FakeReader("no such words here", margin_absent=-5.0)
    events = _ask(make(generator, reader, abstain=True), "What colour is the moon's hat?")
    assert generator.calls == 0
    assert [e.text for e in events if isinstance(e, TokenDelta)] == [ABSTAIN_ANSWER]
    final = events[-1]
    assert isinstance(final, FinalSummary) and final.finish_reason == "abstained"
    retrieval = events[0]
    assert isinstance(retrieval, RetrievalResult) and retrieval.answer is not None and not retrieval.answer.answers


def test_an_engine_that_cannot_answer_gives_way_to_a_confident_span(make) -> None:
    events = _ask(make(FakeDownGenerator(), FakeReader(ANSWER)))
    answer = "".join(e.text for e in events if isinstance(e, TokenDelta))
    assert answer.startswith(ANSWER) and "Fleming" in answer
    final = events[-1]
    assert isinstance(final, FinalSummary) and final.finish_reason == "reader"
    assert any("generator could not answer" in note for note in final.degraded.notes)


def test_an_engine_that_cannot_answer_and_no_span_is_unavailable(make) -> None:
    with pytest.raises(Unavailable):
        _ask(make(FakeDownGenerator(), FakeReader("no such words here")))


def test_retrieve_reads_within_the_retrieval_budget_or_says_it_skipped(make) -> None:
    pipeline = make(None, FakeReader(ANSWER), budget_ms=500.0)

    async def retrieve(budget_ms: int) -> RetrievalResult:
        params = RetrieveParams(QUESTION, top_k=3, budget_ms=budget_ms)
        return await pipeline.retrieve(params, RequestContext(Deadline(budget_ms)), answer_span=True)

    assert (
        asyncio.run(pipeline.retrieve(RetrieveParams(QUESTION, 3, 10_000), RequestContext(Deadline(10_000)))).answer
        is None
    )
    found = asyncio.run(retrieve(10_000))
    assert found.answer is not None and found.answer.text == ANSWER
    rushed = asyncio.run(retrieve(1))  # nothing left of the budget for even one passage
    assert rushed.answer is None and any("reader skipped" in r for r in rushed.degraded.remarks)


def test_a_reading_belongs_to_its_question_and_is_kept_for_it(make) -> None:
    reader = FakeReader(ANSWER)
    pipeline = make(None, reader, budget_ms=500.0)

    async def retrieve(question: str) -> RetrievalResult:
        params = RetrieveParams(question, 3, 10_000)
        return await pipeline.retrieve(params, RequestContext(Deadline(10_000)), answer_span=True)

    asyncio.run(retrieve(QUESTION))
    asyncio.run(retrieve(QUESTION))
    assert len(reader.reads) == 1  # the same question over the same passages: read once
    asyncio.run(retrieve("Who found penicillin first?"))
    assert len(reader.reads) == 2  # another question is read for itself


def test_auto_starts_the_reader_beside_the_prefill_only_when_generation_runs_elsewhere() -> None:
    from ragserve.factory.pipeline import reading_stage
    from ragserve.reports import GeneratorStatus

    class FakeRemote(FakeGeneratorBase):
        def status(self) -> GeneratorStatus:
            return GeneratorStatus(on_this_host=False)

    def beside(generator: object, start: str = "auto") -> bool:
        settings = ReaderSettings(start=start)  # type: ignore[arg-type]
        return reading_stage(FakeReader(ANSWER), None, settings, generator).beside_prefill  # type: ignore[arg-type]

    assert beside(FakeRemote()) and not beside(FakeGenerator()) and not beside(None)
    assert beside(FakeGenerator(), "prefill") and not beside(FakeRemote(), "first_token")


def test_with_no_engine_a_reader_short_of_time_still_reads_the_top_passage(make) -> None:
    from ragserve.read.cost import ReadCost

    reader = FakeReader(ANSWER)
    reader.cost = ReadCost(10_000.0)  # no passage fits the reader's budget
    events = _ask(make(FakeDownGenerator(), reader))
    final = events[-1]
    assert isinstance(final, FinalSummary) and final.finish_reason == "reader"
    assert reader.reads == [(QUESTION, 1)]


def test_an_answer_replayed_from_the_cache_still_gets_the_readers_span_for_its_question(make) -> None:
    generator = FakeGenerator(["Alexander", "Fleming."], usage=Usage(10, 2, 0))
    reader = FakeReader(ANSWER)
    pipeline = make(generator, reader, answers=make_answer_cache(CacheSettings(backend="memory")))

    def ask() -> list[QueryEvent]:
        async def run() -> list[QueryEvent]:
            params = RetrieveParams(QUESTION, top_k=3, budget_ms=10_000)
            request = RequestContext(Deadline(10_000, client_timeout_s=30), "r")
            return [e async for e in pipeline.query(params, GenerateParams(8, 0.0), request)]

        return asyncio.run(run())

    ask()
    replayed = ask()
    final = replayed[-1]
    assert isinstance(final, FinalSummary) and final.answer_cache_hit and len(generator.prompts) == 1
    late = [e for e in replayed if isinstance(e, LateAnswer)]
    assert len(late) == 1 and late[0].answer is not None and late[0].answer.text == ANSWER
    assert isinstance(replayed[-2], LateAnswer)  # after the text, before the final event
    assert final.timings.reader_ms >= 0 and any(isinstance(e, TokenDelta) for e in replayed)


def test_with_lead_the_readers_sentence_is_quoted_before_the_question(make) -> None:
    led = FakeGenerator(["Fleming."], usage=Usage(10, 1, 0))
    _ask(make(led, FakeReader(ANSWER)), "Who discovered penicillin?")
    assert "Key sentence" not in led.prompts[0].user  # off by default
    events = _ask(make(led, FakeReader(ANSWER), policy=AnswerPolicy(reader_lead=True)))
    user = led.prompts[1].user
    rest = user.rpartition("</passages>")[2]
    key = rest.strip().splitlines()[0]
    assert key.startswith("Key sentence from passage ") and ANSWER in key
    assert rest.strip().splitlines()[-1].startswith("Question:")
    # The reader ran before the engine: its span went with the retrieval event.
    assert isinstance(events[0], RetrievalResult) and events[0].answer is not None


def test_a_reading_is_never_given_for_passages_whose_text_changed(make) -> None:
    """A chunk id survives an edit of its document: a reading is kept per passage text, so the
    edited passage is read again instead of getting the old text's span."""
    from ragserve.request.reading import ReadingStage
    from ragserve.types import Chunk, Passage

    reader = FakeReader(ANSWER)
    pipeline = make(None, reader)
    stage = ReadingStage(reader, pipeline.search.threads, max_passages=3, budget_ms=10_000)
    before = Passage(Chunk("c1", "d1", f"It was {ANSWER} in 1928.", "Penicillin"), 1.0, 1)
    after = Passage(Chunk("c1", "d1", "The discoverer's name was redacted.", "Penicillin"), 1.0, 1)

    async def read(passage: Passage) -> object:
        span, _, not_read = await stage.read(
            QUESTION, [passage], "same-identity", 10_000, RequestContext(Deadline(10_000))
        )
        assert not not_read
        return span

    assert asyncio.run(read(before)).text == ANSWER  # type: ignore[attr-defined]
    edited = asyncio.run(read(after))
    assert len(reader.reads) == 2 and edited.text != ANSWER  # type: ignore[attr-defined]


def test_a_replayed_answer_carries_the_index_identity_it_was_found_under(make) -> None:
    generator = FakeGenerator(["Alexander", "Fleming."], usage=Usage(10, 2, 0))
    pipeline = make(generator, FakeReader(ANSWER), answers=make_answer_cache(CacheSettings(backend="memory")))

    async def ask() -> list[QueryEvent]:
        params = RetrieveParams(QUESTION, top_k=3, budget_ms=10_000)
        request = RequestContext(Deadline(10_000, client_timeout_s=30), "r")
        return [e async for e in pipeline.query(params, GenerateParams(8, 0.0), request)]

    asyncio.run(ask())
    replayed = asyncio.run(ask())
    final, first = replayed[-1], replayed[0]
    assert isinstance(final, FinalSummary) and final.answer_cache_hit
    # Its reading is kept under this index, not under an empty identity shared by every version.
    assert isinstance(first, RetrievalResult) and first.index_identity == pipeline.index.identity != ""


class FakeBrokenReader(FakeReader):
    """A reader whose every read raises (a model that cannot take the question, say)."""

    def read(self, question: str, passages: Sequence[str]) -> list[ReadSpan]:
        self.reads.append((question, len(passages)))
        raise RuntimeError("fake reader failure")


def test_a_failing_reader_is_a_note_on_retrieve_never_the_calls_failure(make) -> None:
    reader = FakeBrokenReader(ANSWER)
    pipeline = make(None, reader, budget_ms=500.0)
    params = RetrieveParams(QUESTION, 3, 10_000)
    result = asyncio.run(pipeline.retrieve(params, RequestContext(Deadline(10_000)), answer_span=True))
    assert reader.reads and result.passages and result.answer is None
    assert any(note.startswith("reader failed") for note in result.degraded.remarks)


def test_a_failing_reader_that_may_abstain_leaves_the_answer_to_the_engine(make) -> None:
    generator = FakeGenerator(["Fleming."], usage=Usage(10, 1, 0))
    events = _ask(make(generator, FakeBrokenReader(ANSWER), abstain=True))
    final = events[-1]
    assert isinstance(final, FinalSummary) and final.finish_reason == "stop" and len(generator.prompts) == 1
    assert any(isinstance(e, TokenDelta) and e.text == "Fleming." for e in events)
