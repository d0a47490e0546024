"""The pipeline with the real embedder and index, and a generator fake (named as such)."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ragserve.budget import Deadline, RequestContext
from ragserve.embed.torch_backend import SentenceTransformerEmbedder
from ragserve.errors import DeadlineExpired
from ragserve.events import Citation, FinalSummary, TokenDelta, Usage
from ragserve.factory import assemble_pipeline
from ragserve.index.fusion import RetrievalOptions
from ragserve.index.hnsw import HnswIndex
from ragserve.request.pipeline import RagPipeline
from ragserve.request.policy import ABSTAIN_ANSWER, AnswerPolicy
from ragserve.types import GenerateParams, RetrievalResult, RetrieveParams
from tests.fakes import FakeGenerator, FakeThreadRecordingGenerator


@pytest.fixture
def pipeline_factory(sample_index: Path, embedder: SentenceTransformerEmbedder):
    executor = ThreadPoolExecutor(2)

    def make(
        generator: FakeGenerator | None = None,
        retrieval: RetrievalOptions | None = None,
        policy: AnswerPolicy | None = None,
    ) -> RagPipeline:
        index = HnswIndex.load(sample_index)
        return assemble_pipeline(
            embedder, index, generator or FakeGenerator(), executor, retrieval=retrieval, policy=policy
        )

    yield make
    executor.shutdown()


def test_query_yields_retrieval_then_tokens_then_final(pipeline_factory) -> None:
    fake = FakeGenerator()
    pipeline = pipeline_factory(fake)
    params = RetrieveParams("Who discovered penicillin?", top_k=3, budget_ms=10_000)

    async def collect() -> list[object]:
        return [
            e async for e in pipeline.query(params, GenerateParams(16, 0.0), RequestContext(Deadline(10_000), "r1"))
        ]

    events = asyncio.run(collect())
    assert isinstance(events[0], RetrievalResult)
    assert events[0].passages[0].chunk.doc_id == "discovery-of-penicillin.txt"
    assert [p.rank for p in events[0].passages] == [1, 2, 3]
    assert all(isinstance(e, TokenDelta | Citation) for e in events[1:-1])
    final = events[-1]
    assert isinstance(final, FinalSummary)
    assert final.usage.prefix_cache_hit_tokens == 64
    # Every stage recorded its time into the request once; the retrieval event kept what it had.
    for stage in ("embed", "search", "evidence", "context", "prompt", "ttft"):
        assert getattr(final.timings, f"{stage}_ms") > 0, stage
    assert events[0].timings.prompt_ms == 0 and events[0].timings.embed_ms == final.timings.embed_ms
    # The prompt carries the retrieved passages in rank order, then the question.
    assert '<passage id="1" title="The Discovery of Penicillin">' in fake.prompts[0].user


def test_tiny_budget_still_returns_results_flagged(pipeline_factory) -> None:
    params = RetrieveParams("Bloom filter false positives", top_k=4, budget_ms=1)
    dense = asyncio.run(
        pipeline_factory(retrieval=RetrievalOptions(mode="dense")).retrieve(params, RequestContext(Deadline(1)))
    )
    assert len(dense.passages) == 4
    assert dense.degraded.budget_exhausted
    assert dense.degraded.search_truncated  # HNSW looked only as wide as the 4 results
    # Hybrid fusion asks each list for 100 candidates anyway: nothing was cut, and nothing is said.
    hybrid = asyncio.run(pipeline_factory().retrieve(params, RequestContext(Deadline(1))))
    assert len(hybrid.passages) == 4
    assert hybrid.degraded.budget_exhausted and not hybrid.degraded.search_truncated


def test_expired_client_deadline_stops_before_work(pipeline_factory) -> None:
    pipeline = pipeline_factory()
    params = RetrieveParams("anything", top_k=3, budget_ms=70)
    with pytest.raises(DeadlineExpired):
        asyncio.run(pipeline.retrieve(params, RequestContext(Deadline(70, client_timeout_s=0.0))))


def test_client_deadline_bounds_generation(pipeline_factory) -> None:
    pipeline = pipeline_factory(FakeGenerator(delay_s=0.5))
    params = RetrieveParams("anything", top_k=2, budget_ms=70)

    async def run() -> None:
        async for _ in pipeline.query(
            params, GenerateParams(16, 0.0), RequestContext(Deadline(70, client_timeout_s=0.8), "r2")
        ):
            pass

    with pytest.raises(DeadlineExpired):
        asyncio.run(run())


def test_time_the_consumer_holds_an_event_counts_against_the_client_deadline(pipeline_factory) -> None:
    """The deadline is an absolute end: a consumer that holds the retrieval event for 0.6 s of a
    1 s deadline leaves the engine 0.4 s, not another full second."""
    pipeline = pipeline_factory(FakeGenerator(words=["w"] * 20, delay_s=0.1))
    params = RetrieveParams("anything", top_k=2, budget_ms=70)

    async def run() -> float:
        loop = asyncio.get_running_loop()
        started = loop.time()
        events = pipeline.query(
            params, GenerateParams(16, 0.0), RequestContext(Deadline(70, client_timeout_s=1.0), "r3")
        )
        try:
            async for event in events:
                if isinstance(event, RetrievalResult):
                    await asyncio.sleep(0.6)
        except DeadlineExpired:
            return loop.time() - started
        raise AssertionError("the deadline did not end the stream")

    assert asyncio.run(run()) < 1.4  # ends at about 1.0 s; with the old relative timeout about 1.6 s


def test_stream_pulls_only_as_fast_as_the_reader(pipeline_factory) -> None:
    """A slow reader leaves the engine's output unpulled: nothing piles up between them."""
    # Many chunks, produced as fast as they are asked for.
    fake = FakeGenerator(words=["x"] * 1000 + [""], finish_reason="length", usage=Usage(10, 1000, 0))
    pipeline = pipeline_factory(fake)
    params = RetrieveParams("anything", top_k=2, budget_ms=1000)

    async def read_slowly() -> list[int]:
        seen = []
        stream = pipeline.query(params, GenerateParams(1000, 0.0), RequestContext(Deadline(1000), "slow"))
        consumed = 0
        async for event in stream:
            if isinstance(event, TokenDelta):
                consumed += 1
                await asyncio.sleep(0.01)  # the reader stalls; the producer must not run ahead
                seen.append(fake.produced - consumed)
                if consumed == 20:
                    break
        await stream.aclose()
        return seen

    ahead = asyncio.run(read_slowly())
    assert max(ahead) <= 1


def test_prompt_work_leaves_the_event_loop_free(pipeline_factory) -> None:
    """Fitting the context (a tokenizer call per sentence) runs off the loop: other streams and
    health checks keep being served while a top_k=10 prompt is built. Checked where each token
    count runs (a thread), not by timing the loop's gaps on a machine that may be busy."""
    generator = FakeThreadRecordingGenerator()
    pipeline = pipeline_factory(generator)
    params = RetrieveParams("How does the honey bee waggle dance encode direction?", top_k=10, budget_ms=10_000)

    async def run() -> int:
        events = [
            e async for e in pipeline.query(params, GenerateParams(4, 0.0), RequestContext(Deadline(10_000), "r"))
        ]
        assert isinstance(events[-1], FinalSummary)
        return threading.get_ident()

    loop_thread = asyncio.run(run())
    assert len(generator.counted_on) > 10  # a count per sentence of ten passages
    assert loop_thread not in generator.counted_on


def test_retrieval_carries_each_passages_highlight_and_the_support(pipeline_factory) -> None:
    pipeline = pipeline_factory()
    result = asyncio.run(
        pipeline.retrieve(RetrieveParams("Who discovered penicillin?", 3, 10_000), RequestContext(Deadline(10_000)))
    )
    top = result.passages[0]
    assert top.highlight is not None and top.chunk.doc_id == "discovery-of-penicillin.txt"
    sentence = top.chunk.text[top.highlight.start : top.highlight.end]
    assert "penicillin" in sentence.lower() and "discover" in sentence.lower()
    assert result.support is not None and not result.support.low
    assert 0 < result.timings.evidence_ms <= result.timings.retrieval_total_ms


def test_low_support_is_answered_without_the_engine_when_asked(pipeline_factory) -> None:
    question = "Which quarterback won the 1987 Heisman trophy?"  # in no sample document

    async def ask(policy: AnswerPolicy) -> tuple[list[object], FakeGenerator]:
        fake = FakeGenerator()
        pipeline = pipeline_factory(fake, policy=policy)
        params = RetrieveParams(question, top_k=3, budget_ms=10_000)
        return [
            e async for e in pipeline.query(params, GenerateParams(16, 0.0), RequestContext(Deadline(10_000), "r1"))
        ], fake

    events, fake = asyncio.run(ask(AnswerPolicy(abstain_on_low_support=True)))
    assert fake.calls == 0
    retrieval, token, final = events
    assert isinstance(retrieval, RetrievalResult) and retrieval.support is not None and retrieval.support.low
    assert isinstance(token, TokenDelta) and token.text == ABSTAIN_ANSWER
    assert isinstance(final, FinalSummary) and final.finish_reason == "abstained" and final.usage.prompt_tokens == 0
    assert final.declined
    # Flagged but not acted on by default: the engine answers.
    events, fake = asyncio.run(ask(AnswerPolicy()))
    assert fake.calls == 1 and isinstance(events[0], RetrievalResult) and events[0].support.low
    assert isinstance(events[-1], FinalSummary) and events[-1].finish_reason == "stop"
    assert not events[-1].declined


def test_the_decline_answers_before_the_engine_with_its_evidence_in_the_final_event(pipeline_factory) -> None:
    """A model over `found` (the share of the question's words the passages hold): a question about
    nothing in the sample documents is declined at once; one they cover reaches the engine."""
    from ragserve.request.decline import Decline, DeclineModel

    model = DeclineModel.from_json(
        {"names": ["found"], "mean": [0.2], "std": [0.25], "weights": [-4.0], "bias": 0.0, "calibration": [[0.02, 0.5]]}
    )

    async def ask(question: str) -> tuple[list[object], FakeGenerator]:
        fake = FakeGenerator()
        pipeline = pipeline_factory(fake, policy=AnswerPolicy(decline=Decline(model, 0.5)))
        params = RetrieveParams(question, top_k=3, budget_ms=10_000)
        context = RequestContext(Deadline(10_000), "r1")
        return [e async for e in pipeline.query(params, GenerateParams(16, 0.0), context)], fake

    events, fake = asyncio.run(ask("Which quarterback won the 1987 Heisman trophy?"))
    assert fake.calls == 0 and isinstance(events[1], TokenDelta) and events[1].text == ABSTAIN_ANSWER
    final = events[-1]
    assert isinstance(final, FinalSummary) and final.declined and final.finish_reason == "abstained"
    assert final.decline_evidence is not None and final.decline_evidence.score >= 0.5
    assert final.decline_evidence.signals["found"] < 0.2
    events, fake = asyncio.run(ask("Who discovered penicillin?"))
    assert fake.calls == 1 and isinstance(events[-1], FinalSummary) and events[-1].decline_evidence is None


@pytest.mark.parametrize(
    ("words", "declined"),
    [
        (["The ", "documents ", "do ", "not ", "contain ", "the ", "answer."], True),
        (["The ", "documents ", "do ", "not ", "contain ", "the ", "answer. ", "[1]"], True),
        (["1928 ", "[1]"], False),
        (["The ", "documents ", "do ", "not ", "say, ", "but ", "1928."], False),
    ],
)
def test_a_generator_decline_is_a_field_of_the_final_event(pipeline_factory, words, declined) -> None:
    """The tuned generator's trained decline sentence is reported as such, for a client to test
    (not by matching the text), and counted in the metrics."""
    from ragserve import metrics
    from ragserve.server.observability import observe_final

    async def ask() -> FinalSummary:
        pipeline = pipeline_factory(FakeGenerator(words))
        params = RetrieveParams("Who discovered penicillin?", top_k=3, budget_ms=10_000)
        events = [e async for e in pipeline.query(params, GenerateParams(16, 0.0), RequestContext(Deadline(10_000)))]
        assert isinstance(events[-1], FinalSummary)
        return events[-1]

    counter = metrics.QUERY_DECLINED.labels("generator")
    before = counter._value.get()
    final = asyncio.run(ask())
    observe_final(final)
    assert final.declined is declined
    assert counter._value.get() - before == (1 if declined else 0)


def test_batch_waits_for_its_share_of_the_engine_and_people_do_not(sample_index: Path, embedder) -> None:
    from ragserve.types import RequestClass

    fake = FakeGenerator(delay_s=0.05)
    executor = ThreadPoolExecutor(2)
    pipeline = assemble_pipeline(embedder, HnswIndex.load(sample_index), fake, executor, batch_engine_seqs=1)
    params = RetrieveParams("Who discovered penicillin?", top_k=3, budget_ms=10_000)
    gen = GenerateParams(16, 0.5)  # temperature > 0: no answer cache
    batch, person = RequestClass.BATCH, RequestClass.INTERACTIVE

    async def final(cls: RequestClass, timeout_s: float = 10.0) -> FinalSummary:
        request = RequestContext(Deadline(10_000, client_timeout_s=timeout_s), "r", cls)
        events = [e async for e in pipeline.query(params, gen, request)]
        assert isinstance(events[-1], FinalSummary)
        return events[-1]

    async def run() -> tuple[list[FinalSummary], FinalSummary]:
        jobs = [asyncio.create_task(final(batch)) for _ in range(2)]
        await asyncio.sleep(0.02)
        interactive = await final(person)
        done = list(await asyncio.gather(*jobs))
        # A batch request whose deadline passes while it waits for a slot: DEADLINE_EXCEEDED.
        blocker = asyncio.create_task(final(batch))
        await asyncio.sleep(0.02)
        with pytest.raises(DeadlineExpired):
            await final(batch, timeout_s=0.1)
        await blocker
        return done, interactive

    try:
        jobs, interactive = asyncio.run(run())  # one event loop: the slots belong to it
        waits = sorted(j.timings.engine_wait_ms for j in jobs)
        assert waits[0] < 5 and waits[1] > 50  # the second batch request waited for the first
        assert interactive.timings.engine_wait_ms == 0 and interactive.request_class is RequestClass.INTERACTIVE
        assert all(j.request_class is RequestClass.BATCH for j in jobs)
    finally:
        executor.shutdown()
