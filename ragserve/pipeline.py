"""The request path, over the pluggable parts' Protocols only (no gRPC, torch, vLLM here).

retrieve: embed -> search -> (rerank) under one Deadline; a stage that would overrun is shortened
or skipped and the result says so. query: retrieve, emit the passages, build the prompt, stream
the generator's tokens, then a final summary.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from ragserve.budget import Deadline, StageTimer
from ragserve.embedding import Embedder
from ragserve.errors import DeadlineExpired
from ragserve.generate.base import Generator
from ragserve.index.base import SearchIndex
from ragserve.prompt import build_prompt, stable_order
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

# Below this much budget left after embedding, search uses the smallest breadth (ef = top_k).
_MIN_BUDGET_FOR_FULL_SEARCH_MS = 5.0


class RagPipeline:
    def __init__(
        self,
        embedder: Embedder,
        index: SearchIndex,
        generator: Generator | None,
        executor: ThreadPoolExecutor,
        ef_search: int = 64,
    ) -> None:
        self.embedder = embedder
        self.index = index
        self.generator = generator
        self._executor = executor
        self._ef_search = ef_search

    async def _off_loop(self, fn: Callable[[], T]) -> T:
        # Model calls block for milliseconds: run them on the bounded executor, not the event loop.
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    @staticmethod
    def _check_client(deadline: Deadline, stage: str) -> None:
        if deadline.client_expired():
            raise DeadlineExpired(f"client deadline passed before {stage}")

    async def retrieve(self, params: RetrieveParams, deadline: Deadline) -> RetrievalResult:
        timings = StageTimings()
        degraded = Degraded()
        index = self.index  # one version for the whole request, even if a reload swaps it

        self._check_client(deadline, "embedding")
        with StageTimer() as t:
            vectors = await self._off_loop(lambda: self.embedder.embed_queries([params.query]))
        timings.embed_ms = t.ms

        self._check_client(deadline, "search")
        ef = max(self._ef_search, params.top_k)
        if deadline.budget_left_ms() < _MIN_BUDGET_FOR_FULL_SEARCH_MS:
            ef = params.top_k
            degraded.search_truncated = True
            degraded.note("search breadth cut to top_k: budget nearly spent after embedding")
        query_vector = vectors[0]
        with StageTimer() as t:
            hits = await self._off_loop(lambda: index.search(query_vector, params.top_k, ef))
        timings.search_ms = t.ms

        passages = stable_order([Passage(hit.chunk, hit.score) for hit in hits])
        passages = [Passage(p.chunk, p.score, rank) for rank, p in enumerate(passages, start=1)]
        timings.retrieval_total_ms = deadline.elapsed_ms()
        if deadline.budget_exhausted():
            degraded.budget_exhausted = True
        return RetrievalResult(passages, timings, degraded, index.version)

    async def query(
        self,
        params: RetrieveParams,
        gen: GenerateParams,
        deadline: Deadline,
        request_id: str,
    ) -> AsyncIterator[QueryEvent]:
        if self.generator is None:
            raise RuntimeError("pipeline built without a generator")
        started = time.perf_counter()
        retrieval = await self.retrieve(params, deadline)
        yield retrieval

        timings = retrieval.timings
        with StageTimer() as t:
            prompt = build_prompt(params.query, retrieval.passages)
        timings.prompt_ms = t.ms

        gen_start = time.perf_counter()
        first_token_at: float | None = None
        usage = Usage(0, 0, 0)
        finish_reason = ""
        remaining = deadline.client_left_s()
        try:
            async with asyncio.timeout(remaining):
                async for step in self.generator.stream(prompt, gen, request_id):
                    if step.text:
                        if first_token_at is None:
                            first_token_at = time.perf_counter()
                        yield TokenDelta(step.text)
                    if step.finished:
                        usage = step.usage or usage
                        finish_reason = step.finish_reason
        except TimeoutError as exc:
            raise DeadlineExpired("client deadline passed during generation") from exc

        end = time.perf_counter()
        timings.generation_ms = (end - gen_start) * 1000.0
        if first_token_at is not None:
            timings.ttft_ms = (first_token_at - started) * 1000.0
            if usage.completion_tokens > 1:
                timings.time_per_output_token_ms = (end - first_token_at) * 1000.0 / (usage.completion_tokens - 1)
        timings.total_ms = (end - started) * 1000.0
        yield FinalSummary(usage, timings, retrieval.degraded, finish_reason, self.generator.model_id)
