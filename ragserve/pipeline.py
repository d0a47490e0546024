"""The request path, over the pluggable parts' Protocols only (no gRPC, torch, vLLM here).

retrieve: embed -> search -> (rerank) under one Deadline; a stage that would overrun is shortened
or skipped and the result says so. query: retrieve, emit the passages, build the prompt, stream
the generator's tokens, then a final summary; a temperature-0 question answered cleanly before
(same passages' key, model, template and limits) is replayed from the answer cache instead.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import numpy as np

from ragserve.budget import Deadline, StageTimer
from ragserve.cache.base import AnswerCache, CachedAnswer, CachedRetrieval, CacheHit, RetrievalCache
from ragserve.cache.keys import AnswerKey, RetrievalKey, answer_key, prompt_template_id, retrieval_key
from ragserve.config import QdrantSettings, RetrievalSettings, Settings, default_of
from ragserve.context import fit_context
from ragserve.embedding import Embedder
from ragserve.errors import ConfigError, DeadlineExpired, Unavailable
from ragserve.generate.base import Generator
from ragserve.index.base import SearchIndex
from ragserve.index.fusion import RetrievalOptions, hybrid_search
from ragserve.prompt import build_prompt, stable_order
from ragserve.rerank.base import Reranker
from ragserve.types import (
    Degraded,
    FinalSummary,
    GenerateParams,
    Passage,
    QueryEvent,
    RetrievalResult,
    RetrieveParams,
    StageTimings,
    TokenDelta,
    Usage,
)

T = TypeVar("T")

log = logging.getLogger(__name__)

# Below this much budget left after embedding, search uses the smallest breadth (ef = top_k).
_MIN_BUDGET_FOR_FULL_SEARCH_MS = 5.0


async def _resume(first: asyncio.Future[T], rest: AsyncIterator[T]) -> AsyncIterator[T]:
    """The first item from an already started `anext`, then the rest of the same iterator."""
    try:
        item = await first
    except StopAsyncIteration:
        return
    yield item
    async for item in rest:
        yield item


class RagPipeline:
    def __init__(
        self,
        embedder: Embedder,
        index: SearchIndex,
        generator: Generator | None,
        executor: ThreadPoolExecutor,
        ef_search: int = default_of(RetrievalSettings, "hnsw_ef_search"),
        cache: RetrievalCache | None = None,
        retrieval: RetrievalOptions | None = None,
        reranker: Reranker | None = None,
        prompt_layout: str = default_of(Settings, "prompt_layout"),
        rerank_executor: ThreadPoolExecutor | None = None,
        answers: AnswerCache | None = None,
        search_executor: ThreadPoolExecutor | None = None,
        search_min_ms: float = default_of(QdrantSettings, "min_search_ms"),
    ) -> None:
        self.embedder = embedder
        self.index = index
        self.generator = generator
        self._executor = executor
        # Reranking holds a thread for up to the whole budget; on its own pool, the next request's
        # few-millisecond embed and search never wait behind it.
        self._rerank_executor = rerank_executor or executor
        # A remote index (Qdrant) searches on its own threads, bounded by the budget: a slow or
        # silent server must neither hold the embedding threads nor outlive the request's budget.
        self._search_executor = search_executor
        self._search_min_ms = search_min_ms
        self._ef_search = ef_search
        self.retrieval = retrieval or RetrievalOptions()
        self.cache = cache
        self.reranker = reranker
        # "stable" keeps the template prefix first (prefix cache); "naive" exists for baselines.
        self.prompt_layout = prompt_layout
        self.answers = answers

    def close(self) -> None:
        """Release the model threads (at shutdown, after in-flight calls have finished)."""
        self._executor.shutdown(wait=False, cancel_futures=True)
        if self._rerank_executor is not self._executor:
            self._rerank_executor.shutdown(wait=False, cancel_futures=True)
        if self._search_executor is not None:
            self._search_executor.shutdown(wait=False, cancel_futures=True)

    async def _off_loop(self, fn: Callable[[], T], executor: ThreadPoolExecutor | None = None) -> T:
        # Model calls block for milliseconds: run them on a bounded executor, not the event loop.
        return await asyncio.get_running_loop().run_in_executor(executor or self._executor, fn)

    @staticmethod
    def _check_client(deadline: Deadline, stage: str) -> None:
        if deadline.client_expired():
            raise DeadlineExpired(f"client deadline passed before {stage}")

    def _cache_key(self, params: RetrieveParams, index_version: str, index_identity: str) -> RetrievalKey:
        # Everything that changes the passage list; a rerank stage adds its model ids here.
        rerank = tuple(self.reranker.describe()) if self.reranker is not None else ()
        return retrieval_key(
            params.query,
            params.top_k,
            index_version,
            (self.embedder.model_id,),
            (f"ef={self._ef_search}", self.retrieval.cache_tag(params.dedupe_documents), *rerank),
            index_identity,
        )

    async def _cache_lookup(self, key: RetrievalKey, query_vector: np.ndarray | None = None) -> CacheHit | None:
        # The cache must never fail a request: any error is a miss (implementations already count it).
        assert self.cache is not None
        try:
            if query_vector is None:
                return await self.cache.get(key)
            return await self.cache.get_similar(key, query_vector)
        except Exception:
            log.exception("retrieval cache lookup failed; continuing without it")
            return None

    def _cache_store(self, key: RetrievalKey, result: RetrievalResult, query_vector: np.ndarray | None) -> None:
        assert self.cache is not None
        entry = CachedRetrieval(
            tuple(result.passages),
            result.index_version,
            tuple(result.rerank_tiers),
            key.query,
            result.degraded.is_degraded(),
        )
        try:
            self.cache.put(key, entry, query_vector)
        except Exception:
            log.exception("retrieval cache write failed; continuing without it")

    def _answer_key(self, params: RetrieveParams, gen: GenerateParams, retrieval: RetrievalResult) -> AnswerKey:
        # The version the retrieval used (maybe a retrieval cache hit), not the index served now.
        generator = self.generator
        assert generator is not None
        # Engine settings (dtype, speculation) can change a greedy answer: they are part of the key.
        engine = ",".join(f"{c.name}={c.value}" for c in generator.engine_choices)
        return answer_key(
            self._cache_key(params, retrieval.index_version, retrieval.index_identity),
            f"{generator.model_id}|{engine}",
            prompt_template_id(self.prompt_layout),
            gen.context_token_budget,
            gen.max_tokens,
        )

    async def _answer_lookup(self, key: AnswerKey) -> CachedAnswer | None:
        assert self.answers is not None
        try:
            return await self.answers.get(key)
        except Exception:
            log.exception("answer cache lookup failed; generating the answer")
            return None

    def _answer_store(self, key: AnswerKey, entry: CachedAnswer) -> None:
        assert self.answers is not None
        try:
            self.answers.put(key, entry)  # a background write: the final event does not wait
        except Exception:
            log.exception("answer cache write failed; continuing without it")

    @staticmethod
    def _from_cache(hit: CacheHit, identity: str, timings: StageTimings, deadline: Deadline) -> RetrievalResult:
        degraded = Degraded()
        if hit.kind == "semantic":
            # Never the other query's text: it is another caller's question.
            degraded.note("passages reused from a near-duplicate earlier query (semantic cache)")
        if hit.entry.degraded:
            degraded.note("cached passages come from a ranking that was cut short by the budget")
        timings.retrieval_total_ms = deadline.elapsed_ms()
        entry = hit.entry
        # The entry was found under a key of `identity` (it is in the scope), so it is that index's.
        return RetrievalResult(
            list(entry.passages),
            timings,
            degraded,
            entry.index_version,
            list(entry.rerank_tiers),
            cache_hit=True,
            index_identity=identity,
        )

    async def retrieve(self, params: RetrieveParams, deadline: Deadline) -> RetrievalResult:
        timings = StageTimings()
        degraded = Degraded()
        index = self.index  # one version for the whole request, even if a reload swaps it

        cache_key = None
        if self.cache is not None:
            cache_key = self._cache_key(params, index.version, index.identity)
            with StageTimer("cache") as t:
                hit = await self._cache_lookup(cache_key)
            timings.cache_ms = t.ms
            if hit is not None:
                return self._from_cache(hit, index.identity, timings, deadline)

        self._check_client(deadline, "embedding")
        with StageTimer("embed") as t:
            embedded = await self._off_loop(lambda: self.embedder.embed_query(params.query))
        timings.embed_ms = t.ms
        query_vector = embedded.vector
        # A query longer than the embedder's window is embedded by its prefix alone: any two sharing
        # that prefix score a cosine near 1, so such a query is never matched or offered semantically.
        semantic_vector = query_vector if embedded.fits_window else None

        if (
            self.cache is not None
            and cache_key is not None
            and self.cache.semantic_enabled
            and semantic_vector is not None
        ):
            with StageTimer("semantic_cache") as t:
                hit = await self._cache_lookup(cache_key, semantic_vector)
            timings.cache_ms += t.ms
            if hit is not None:
                return self._from_cache(hit, index.identity, timings, deadline)

        self._check_client(deadline, "search")
        ef = max(self._ef_search, params.top_k)
        if deadline.budget_left_ms() < _MIN_BUDGET_FOR_FULL_SEARCH_MS:
            ef = params.top_k
            degraded.search_truncated = True
            degraded.note("search breadth cut to top_k: budget nearly spent after embedding")
        # The reranker reorders a deeper candidate list than the caller asked for.
        fetch_k = params.top_k if self.reranker is None else max(params.top_k, self.reranker.candidates)
        ef = max(ef, fetch_k)
        with StageTimer("search") as t:
            hits, _ = await self._search(
                lambda: hybrid_search(
                    index, params.query, query_vector, fetch_k, ef, self.retrieval, params.dedupe_documents
                ),
                deadline,
            )
        timings.search_ms = t.ms

        passages = stable_order([Passage(hit.chunk, hit.score) for hit in hits])
        rerank_tiers: list[str] = []
        if self.reranker is not None:
            passages, rerank_tiers = await self._rerank(params.query, passages, deadline, timings, degraded)
        passages = [Passage(p.chunk, p.score, rank) for rank, p in enumerate(passages[: params.top_k], start=1)]
        timings.retrieval_total_ms = deadline.elapsed_ms()
        if deadline.budget_exhausted():
            degraded.budget_exhausted = True
        result = RetrievalResult(
            passages, timings, degraded, index.version, rerank_tiers, index_identity=index.identity
        )
        # The cache decides what a result cut short by the budget is worth (by default: not stored).
        if self.cache is not None and cache_key is not None:
            self._cache_store(cache_key, result, semantic_vector)
        return result

    async def _search(self, fn: Callable[[], T], deadline: Deadline) -> T:
        """A local index searches on the model threads; a remote one on its own, within the budget."""
        if self._search_executor is None:
            return await self._off_loop(fn)
        # Without any results there is nothing to degrade to, so a nearly spent budget still gets a
        # short try (search_min_ms) rather than none; the caller's own deadline is never exceeded.
        wait_s = max(deadline.budget_left_ms(), self._search_min_ms) / 1000.0
        client_left = deadline.client_left_s()
        if client_left is not None:
            wait_s = min(wait_s, client_left)
        future = asyncio.get_running_loop().run_in_executor(self._search_executor, fn)
        try:
            return await asyncio.wait_for(future, wait_s)
        except TimeoutError:
            # The thread stays in the call until the client's timeout frees it; the request does not wait.
            self._check_client(deadline, "the index answered")
            raise Unavailable(
                f"the index did not answer within the retrieval budget ({wait_s * 1000.0:.0f} ms)"
            ) from None

    async def _rerank(
        self, query: str, passages: list[Passage], deadline: Deadline, timings: StageTimings, degraded: Degraded
    ) -> tuple[list[Passage], list[str]]:
        """Reorder under the Deadline; it decides depth before each batch. Never fails the request."""
        reranker = self.reranker
        assert reranker is not None
        with StageTimer("rerank") as t:
            outcome = await self._off_loop(lambda: reranker.rerank(query, passages, deadline), self._rerank_executor)
        timings.rerank_ms = t.ms
        degraded.rerank_skipped = outcome.skipped
        degraded.rerank_truncated = outcome.truncated
        for note in outcome.notes:
            degraded.note(note)
        return outcome.passages, outcome.tiers

    async def query(
        self,
        params: RetrieveParams,
        gen: GenerateParams,
        deadline: Deadline,
        request_id: str,
    ) -> AsyncIterator[QueryEvent]:
        if self.generator is None:
            raise ConfigError("generation is disabled on this server (RAGSERVE_GENERATION_ENABLED=false); use Retrieve")
        started = time.perf_counter()
        retrieval = await self.retrieve(params, deadline)

        timings = retrieval.timings
        generator = self.generator
        # Only greedy (temperature 0) answers are reproducible, so only they are served again.
        answer_key = None
        if self.answers is not None and gen.temperature == 0.0:
            answer_key = self._answer_key(params, gen, retrieval)
            with StageTimer("answer_cache") as t:
                cached = await self._answer_lookup(answer_key)
            timings.answer_cache_ms = t.ms
            if cached is not None:
                for event in cached.replay(timings, started):  # the engine is not asked at all
                    yield event
                return

        with StageTimer("context") as t:
            context = fit_context(params.query, retrieval.passages, gen.context_token_budget, generator.count_tokens)
        timings.context_ms = t.ms
        with StageTimer("prompt") as t:
            prompt = build_prompt(params.query, context.passages, self.prompt_layout)
        timings.prompt_ms = t.ms

        gen_start = time.perf_counter()
        first_token_at: float | None = None
        usage = Usage(0, 0, 0)
        finish_reason = ""
        pieces: list[str] = []
        remaining = deadline.client_left_s()
        stream = generator.stream(prompt, gen, request_id)
        # Hand the prompt to the engine before the retrieval event is sent: prefill overlaps the send.
        first = asyncio.ensure_future(anext(stream))
        try:
            yield retrieval
            async with asyncio.timeout(remaining):
                async for step in _resume(first, stream):
                    if step.text:
                        if first_token_at is None:
                            first_token_at = time.perf_counter()
                        pieces.append(step.text)
                        yield TokenDelta(step.text)
                    if step.finished:
                        usage = step.usage or usage
                        finish_reason = step.finish_reason
        except TimeoutError as exc:
            raise DeadlineExpired("client deadline passed during generation") from exc
        finally:
            # The caller went away (or failed) before the first step: abort the engine request.
            if not first.done():
                first.cancel()
            await asyncio.gather(first, return_exceptions=True)
            if isinstance(stream, AsyncGenerator):
                await stream.aclose()

        end = time.perf_counter()
        timings.generation_ms = (end - gen_start) * 1000.0
        if first_token_at is not None:
            timings.ttft_ms = (first_token_at - started) * 1000.0
            if usage.completion_tokens > 1:
                timings.time_per_output_token_ms = (end - first_token_at) * 1000.0 / (usage.completion_tokens - 1)
        timings.total_ms = (end - started) * 1000.0
        # Reached only after a finish (a cancel, an engine failure or the deadline raised above);
        # a length-cut answer or one from passages cut short by the budget is never replayed.
        if answer_key is not None and finish_reason == "stop" and not retrieval.degraded.is_degraded():
            self._answer_store(
                answer_key,
                CachedAnswer(
                    "".join(pieces),
                    tuple(retrieval.passages),
                    retrieval.index_version,
                    tuple(retrieval.rerank_tiers),
                    usage,
                    generator.model_id,
                    context.tokens,
                    context.tokens_full,
                ),
            )
        yield FinalSummary(
            usage,
            timings,
            retrieval.degraded,
            finish_reason,
            generator.model_id,
            context_tokens=context.tokens,
            context_tokens_full=context.tokens_full,
        )
