"""The request path, over the pluggable parts' Protocols only (no gRPC, torch, vLLM here).

retrieve: embed -> search -> (rerank) under one Deadline; a stage that would overrun is shortened or skipped and the
result says so. query: retrieve, emit the passages, build the prompt, stream the generator's tokens, then a final
summary; a temperature-0 question answered cleanly before (same passages' key, model, template and limits) is replayed
from the answer cache instead. The pipeline owns its parts' lifecycle: `async with pipeline:` (or astart/aclose).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
from collections.abc import AsyncGenerator, Callable
from typing import TypeVar

from ragserve import metrics
from ragserve.budget import RequestContext
from ragserve.cache.keys import AnswerKey, RetrievalKey
from ragserve.config import LimitsSettings, default_of
from ragserve.embed.base import Embedder
from ragserve.errors import ConfigError
from ragserve.events import QueryEvent
from ragserve.filters import Filter, check_fields
from ragserve.generate.base import Generator
from ragserve.generate.host_share import HostSharePace
from ragserve.index.base import SearchIndex
from ragserve.reports import PipelineInfo, WarmState
from ragserve.request.answer import AnswerStream
from ragserve.request.batch_share import BatchShare
from ragserve.request.caches import PipelineCaches
from ragserve.request.citations import with_citations
from ragserve.request.conversation import search_embedding
from ragserve.request.evidence import with_answer, with_evidence
from ragserve.request.hot import HotPassages
from ragserve.request.info import InfoParts, pipeline_info
from ragserve.request.model_threads import CURRENT_CLASS
from ragserve.request.policy import AnswerPolicy
from ragserve.request.prompting import fit_and_build
from ragserve.request.readable import ReadableCounts
from ragserve.request.reading import ReadingStage, ReadWithin
from ragserve.request.reply import declined, reader_start, replay_answer, stream_answer
from ragserve.request.search import SearchStage, check_client
from ragserve.request.sentences import SentenceTable
from ragserve.request.serving import ServingVersion, VersionSource
from ragserve.request.summary import Outcome, final_summary, record_answer
from ragserve.request.warming import QueryTraffic, Warmer
from ragserve.rerank.base import Reranker
from ragserve.types import GenerateParams, RetrievalResult, RetrieveParams

T = TypeVar("T")

# Passages whose highlights are chosen on the event loop (more go to the model threads).
_EVIDENCE_ON_LOOP_MAX = 10

log = logging.getLogger(__name__)


class RagPipeline:
    def __init__(
        self,
        versions: VersionSource,
        search: SearchStage,
        generator: Generator | None,
        caches: PipelineCaches,
        policy: AnswerPolicy,
        hot: HotPassages,
        reading: ReadingStage | None = None,
        batch_engine_seqs: int = default_of(LimitsSettings, "batch_max_engine_seqs"),
    ) -> None:
        """The parts come from the factory (`ragserve/factory/pipeline.py` `assemble_pipeline`).
        `hot`: the top passages Query retrieves (what warming pre-fills); `reading`: the extractive
        reader (None: off); `batch_engine_seqs`: batch's share of the generator (0: no cap), so
        interactive requests never wait for it."""
        self.versions = versions
        self.search = search
        self.generator = generator
        self.caches = caches
        self.policy = policy
        self.hot = hot
        self.reading = reading
        self.pace = HostSharePace()  # is the engine running at this host's pace (a busy neighbour)?
        self._batch_share = BatchShare(batch_engine_seqs)
        self._traffic = QueryTraffic()  # warming gives way to it
        self._warmer = Warmer(generator, policy, hot, search.threads, self._traffic) if generator else None
        self._readable = ReadableCounts()

    @property
    def serving(self) -> ServingVersion:
        """What the current version serves with; a request reads it once."""
        return self.versions.current

    @property
    def index(self) -> SearchIndex:
        return self.serving.index

    @property
    def embedder(self) -> Embedder:
        """The query embedder serving the current version (its own tuned one, if it ships one)."""
        return self.serving.embedder

    @property
    def reranker(self) -> Reranker | None:
        """The reranker serving the current index version (None: fused order)."""
        return self.serving.reranker

    def refused(self, reason: str) -> None:
        self.versions.refused(reason)

    def swap_index(self, index: SearchIndex) -> None:
        """A newly published version, from the next request on (request/serving.py `VersionSource.swap`)."""
        self.versions.swap(index)

    async def astart(self) -> None:
        """Warm every part before traffic: the embedder, the engine, the reranker, the cache pools."""
        serving = self.serving
        await self._off_loop(lambda: serving.embedder.embed_queries(["warm-up"]))
        if self.generator is not None:
            await self.generator.start()
            if self.generator.status().on_this_host:  # a remote server's pace is not this host's
                await self.pace.measure_baseline(self.generator)
            self.hot.load()  # warming itself starts once the server is SERVING (warm_hot_passages)
        # After the engine is up: each tier measures its cost at the load it will serve under.
        await self.search.warm_up(serving)
        if serving.reranker is not None:
            log.info("rerank tiers: %s", "; ".join(serving.reranker.describe()))
        await self.caches.start()

    def warm_state(self) -> WarmState:
        """What warming did for the serving version (done, nothing warmed, without a generator)."""
        return self._warmer.state if self._warmer is not None else WarmState(self.serving.identity, done=True)

    async def info_for(self, grant: Filter | None) -> PipelineInfo:
        """Info for one caller: the chunks its grant reads counted off the loop, once per version."""
        return self.info(grant, await self._readable.count(self.serving, grant, self._off_loop))

    def info(self, grant: Filter | None = None, chunks: int | None = None) -> PipelineInfo:
        """What this pipeline serves with now (Info); its chunk count (`chunks`, else counted here)
        is of those `grant` may read."""
        parts = InfoParts(self.serving, self.versions, self.generator, self.reading, self.pace, self.warm_state())
        return pipeline_info(parts, grant, chunks)

    async def warm_hot_passages(self) -> int:
        """Pre-fill the engine's prefix cache for the serving version (request/warming.py): at start,
        after a hot reload and when a generation server comes back. How many passages were warmed."""
        return 0 if self._warmer is None else await self._warmer.warm(self.serving)

    def save_counts(self) -> None:
        """Persist the retrieval counts (blocking: call it off the event loop)."""
        self.hot.save()

    async def aclose(self) -> None:
        """After in-flight calls have finished: flush cache writes and the retrieval counts, stop the
        engine, free the threads."""
        await self.caches.close()
        await asyncio.to_thread(self.save_counts)
        if self.generator is not None:
            await self.generator.close()
        self.search.threads.shutdown()

    async def __aenter__(self) -> RagPipeline:
        await self.astart()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _off_loop(self, fn: Callable[[], T]) -> T:
        # Model calls block for milliseconds: run them on the model threads, not the event loop.
        return await self.search.threads.run(fn)

    async def retrieve(
        self, params: RetrieveParams, request: RequestContext, answer_span: bool = False
    ) -> RetrievalResult:
        """`answer_span`: the reader also runs, within what is left of the retrieval budget."""
        result, _, _ = await self._retrieve(params, request, self.serving, "retrieval" if answer_span else "none")
        return result

    async def _retrieve(
        self, params: RetrieveParams, request: RequestContext, serving: ServingVersion, read: ReadWithin = "none"
    ) -> tuple[RetrievalResult, RetrievalKey | None, SentenceTable]:
        """The passages with this question's evidence, the request's cache key (built once, reused
        for the answer cache) and its sentence table (the context budget reuses it). `read`: the
        reader runs now, within what is left of the retrieval budget, or within its own."""
        CURRENT_CLASS.set(request.request_class)  # this request's task: its model calls queue by class
        # An engine on this host rests between its steps and layers until this retrieval is done.
        with self.search.threads.first.retrieving(request.interactive):
            return await self._retrieve_first(params, request, serving, read)

    async def _retrieve_first(
        self, params: RetrieveParams, request: RequestContext, serving: ServingVersion, read: ReadWithin
    ) -> tuple[RetrievalResult, RetrievalKey | None, SentenceTable]:
        deadline = request.deadline
        found, key = await self._find(params, request, serving)
        with request.stage("evidence"):
            # Per request, on whatever the passages came from (a cache hit was another question's).
            # Under a millisecond at the default top_k; at 50 passages ~5 ms, too long for the loop
            # (BENCHMARKS.md, "Highlights and abstention").
            evidence = functools.partial(self._evidence, params.search_text, found)
            result, table = (
                evidence() if len(found.passages) <= _EVIDENCE_ON_LOOP_MAX else await self._off_loop(evidence)
            )
        if read != "none" and self.reading is not None and result.passages:
            budget_ms = deadline.budget_left_ms() if read == "retrieval" else self.reading.budget_ms
            span, _, not_read = await self.reading.read(
                params.query, result.passages, result.index_identity, budget_ms, request
            )
            if not_read:  # skipped for time, or failed: the passages go out as retrieved
                result.degraded = result.degraded.remarked(not_read)
            else:
                result = with_answer(params.query, result, span, self.reading.highlight, table)
        request.timings.retrieval_total_ms = deadline.elapsed_ms()
        result.timings = request.timings_so_far()
        return result, key, table

    def _evidence(self, query: str, found: RetrievalResult) -> tuple[RetrievalResult, SentenceTable]:
        table = SentenceTable.of(query, [p.chunk for p in found.passages])
        return with_evidence(query, found, self.policy.low_support_below, table), table

    async def _find(
        self, params: RetrieveParams, request: RequestContext, serving: ServingVersion
    ) -> tuple[RetrievalResult, RetrievalKey | None]:
        """The passages (their timings are filled in by `_retrieve`) and the request's cache key."""
        index = serving.index  # one version for the whole request, even if a reload swaps it
        deadline = request.deadline
        check_fields(params.filter, index.fields)
        key = self.caches.key_for(params, index.version, index.identity)
        with request.stage("cache"):
            hit = await self.caches.lookup(key, deadline.budget_left_ms() / 1000.0)
        if hit is not None:
            return hit.result(index.identity, request.timings), key
        check_client(deadline, "embedding")
        with request.stage("embed"):
            embedded = await self._off_loop(lambda: search_embedding(serving.embedder, params))
        # A query longer than the embedder's window is embedded by its prefix alone: any two sharing
        # that prefix score a cosine near 1, so such a query is never matched or offered semantically.
        semantic_vector = embedded.vector if embedded.fits_window else None
        if semantic_vector is not None and self.caches.semantic_enabled():
            with request.stage("semantic_cache", into="cache"):
                hit = await self.caches.lookup_similar(key, semantic_vector, deadline.budget_left_ms() / 1000.0)
            if hit is not None:
                return hit.result(index.identity, request.timings), key
        searched = await self.search.run(params, serving, embedded.vector, request)
        result = RetrievalResult(
            searched.passages,
            request.timings_so_far(),
            searched.degraded,
            index.version,
            searched.rerank_tiers,
            index_identity=index.identity,
        )
        # The cache decides what a result cut short by the budget is worth (by default: not stored).
        self.caches.store(key, result, semantic_vector)
        return result, key

    async def query(
        self, params: RetrieveParams, gen: GenerateParams, request: RequestContext
    ) -> AsyncGenerator[QueryEvent, None]:
        """`_query`'s events; while an interactive one runs, warming waits (and paces itself beside batch ones)."""
        with self._traffic.running(request.interactive):
            async with contextlib.aclosing(with_citations(self._query(params, gen, request))) as events:
                async for event in events:
                    yield event

    async def _query(
        self, params: RetrieveParams, gen: GenerateParams, request: RequestContext
    ) -> AsyncGenerator[QueryEvent, None]:
        generator = self.generator
        if generator is None:
            raise ConfigError("generation is disabled on this server (RAGSERVE_GENERATION_ENABLED=false); use Retrieve")
        deadline = request.deadline
        # Its verdict decides the engine call (abstain), or its sentence goes into the prompt (lead).
        reader_first = self.reading is not None and (self.reading.abstain or self.policy.reader_lead)
        retrieval, key, table = await self._retrieve(params, request, self.serving, "own" if reader_first else "none")
        self._count_top(retrieval)
        timings = request.timings  # the retrieval event has its own copy
        declines, judged = self.policy.declines(retrieval, table, self.reading is not None and self.reading.abstain)
        if declines:
            for event in declined(retrieval, timings, generator.model_id, deadline.elapsed_ms, judged):
                yield event
            return
        answer_key = self.caches.answer_key(key, gen)
        if answer_key is not None:
            with request.stage("answer_cache"):
                cached = await self.caches.lookup_answer(answer_key, deadline.client_left_s())
            if cached is not None:  # the engine is not asked at all
                replayed = replay_answer(
                    cached,
                    retrieval.index_identity,
                    request,
                    lambda cited: with_evidence(params.search_text, cited, self.policy.low_support_below),
                    lambda cited: reader_start(self.reading, params.query, cited, request),
                )
                async with contextlib.aclosing(replayed) as events:
                    async for event in events:
                        yield event
                return
        answering = self._generate(params.query, gen, request, retrieval, table, answer_key)
        async with contextlib.aclosing(answering):  # closed now: a caller gone aborts the engine request
            async for event in answering:
                yield event

    async def _generate(
        self,
        question: str,
        gen: GenerateParams,
        request: RequestContext,
        retrieval: RetrievalResult,
        table: SentenceTable,
        answer_key: AnswerKey | None,
    ) -> AsyncGenerator[QueryEvent, None]:
        """The engine's answer, the reader beside it; then the final summary."""
        generator, deadline, timings = self.generator, request.deadline, request.timings
        assert generator is not None
        budget, policy, warm_top = gen.context_token_budget, self.policy, self._top_is_warm(retrieval)
        fit = (policy, question, retrieval.passages, table, budget, generator, request, retrieval.answer, warm_top)
        context, prompt = await self._off_loop(lambda: fit_and_build(*fit, gen.history))
        alone = generator.unfinished_requests() == 0
        outcome = Outcome(retrieval)
        async with self._batch_share.hold(request):
            # The engine has the prompt before the retrieval event is sent: prefill overlaps the send.
            gen = dataclasses.replace(gen, priority=request.request_class.engine_priority)
            answer = AnswerStream.start(generator, prompt, gen, request.request_id, deadline.elapsed_ms)
            reader = reader_start(self.reading, question, retrieval, request)
            end = deadline.client_end(asyncio.get_running_loop())
            events = stream_answer(question, answer, retrieval, reader, end, outcome)
            # Closing both now, not when garbage collected: a caller gone mid-stream aborts the engine request.
            async with contextlib.aclosing(answer), contextlib.aclosing(events):
                async for event in events:
                    yield event
        run = answer.run
        record_answer(timings, run, outcome)
        if not outcome.fallback:
            self.pace.record(timings.time_per_output_token_ms, alone and generator.unfinished_requests() == 0)
        # Reached only after a finish (a cancel, an engine failure or the deadline raised above);
        # a length-cut answer or one from passages cut short by the budget is never replayed.
        if answer_key is not None and run.finish_reason == "stop" and not retrieval.degraded.is_degraded():
            self.caches.store_answer(answer_key, run, retrieval, generator.model_id, context)
        yield final_summary(outcome, run, timings, generator.model_id, context, request.request_class)

    def _count_top(self, retrieval: RetrievalResult) -> None:
        """The top passage's retrieval count (warming's order), and whether it was warm."""
        if retrieval.passages:
            self.hot.record(retrieval.passages[0].chunk.chunk_id)
            if self._warmer is not None:
                metrics.QUERY_TOP_WARM.labels("yes" if self._top_is_warm(retrieval) else "no").inc()

    def _top_is_warm(self, retrieval: RetrievalResult) -> bool:
        top = retrieval.passages[0].chunk.chunk_id if retrieval.passages else None
        return top is not None and self._warmer is not None and self._warmer.is_warm(top)
