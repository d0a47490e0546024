"""Search and rerank, the budgeted middle of the request path (after embedding, before caching).

Breadth is planned once (index/fusion.py `plan_breadth`); a local index searches on the model
threads, a remote one (Qdrant) on its own threads within the budget; the reranker reorders on its
own threads under the Deadline; the degraded flags say what was really cut.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from ragserve.budget import Deadline, RequestContext
from ragserve.errors import DeadlineExpired, Unavailable
from ragserve.index.base import ScoredChunk
from ragserve.index.fusion import RetrievalOptions, effective_mode, hybrid_search, plan_breadth
from ragserve.prompt import stable_order
from ragserve.request.model_threads import ModelThreads
from ragserve.request.serving import ServingVersion
from ragserve.rerank.base import Reranker, RerankerSource, RerankOutcome
from ragserve.types import Degraded, Passage, RetrieveParams

# Below this much budget left after embedding, search looks no further than the results asked for.
_MIN_BUDGET_FOR_FULL_SEARCH_MS = 5.0


def check_client(deadline: Deadline, stage: str) -> None:
    if deadline.client_expired():
        raise DeadlineExpired(f"client deadline passed before {stage}")


@dataclass(frozen=True, slots=True)
class Searched:
    """What search and rerank found for one request (each recorded its time into the request)."""

    passages: list[Passage]
    degraded: Degraded
    rerank_tiers: list[str]


class SearchStage:
    def __init__(
        self,
        options: RetrievalOptions,
        ef_search: int,
        rerankers: RerankerSource | None,
        threads: ModelThreads,
        search_min_ms: float = 25.0,
    ) -> None:
        self.options = options
        self.ef_search = ef_search
        self.rerankers = rerankers  # how a version's reranker is chosen (for cache keys; None: none)
        self.threads = threads
        self._search_min_ms = search_min_ms

    async def run(
        self, params: RetrieveParams, serving: ServingVersion, vector: np.ndarray, request: RequestContext
    ) -> Searched:
        deadline = request.deadline
        check_client(deadline, "search")
        index, options, reranker = serving.index, serving.retrieval, serving.reranker
        mode = effective_mode(index, options)
        # The reranker reorders a deeper candidate list than the caller asked for.
        k = params.top_k if reranker is None else max(params.top_k, reranker.candidates)
        narrow = deadline.budget_left_ms() < _MIN_BUDGET_FOR_FULL_SEARCH_MS
        breadth = plan_breadth(options, mode, k, self.ef_search, params.dedupe_documents, narrow)
        with request.stage("search"):
            hits = await self._search(
                lambda: hybrid_search(
                    index,
                    params.lexical_text,
                    vector,
                    breadth,
                    options,
                    mode,
                    params.dedupe_documents,
                    params.narrowing,
                ),
                deadline,
            )
        outcome = RerankOutcome(
            stable_order([Passage(hit.chunk, hit.score, dense=hit.dense, lexical=hit.lexical) for hit in hits])
        )
        if reranker is not None:
            with request.stage("rerank"):
                outcome = await self._rerank(reranker, params.search_text, outcome.passages, deadline)
        top = [replace(p, rank=rank) for rank, p in enumerate(outcome.passages[: params.top_k], start=1)]
        degraded = Degraded.of_search(
            breadth_cut=breadth.cut,
            lexical_missing=mode != self.options.mode,
            rerank_skipped=outcome.skipped,
            rerank_truncated=outcome.truncated,
            rerank_notes=tuple(outcome.notes),
            budget_exhausted=deadline.budget_exhausted(),
        )
        return Searched(top, degraded, outcome.tiers)

    async def _search(self, fn: Callable[[], list[ScoredChunk]], deadline: Deadline) -> list[ScoredChunk]:
        """A local index searches on the model threads; a remote one on its own, within the budget."""
        loop = asyncio.get_running_loop()
        if self.threads.search is None:
            return await loop.run_in_executor(self.threads.models, fn)
        # Without any results there is nothing to degrade to, so a nearly spent budget still gets a
        # short try (search_min_ms) rather than none; the caller's own deadline is never exceeded.
        wait_s = max(deadline.budget_left_ms(), self._search_min_ms) / 1000.0
        client_left = deadline.client_left_s()
        if client_left is not None:
            wait_s = min(wait_s, client_left)
        try:
            return await asyncio.wait_for(loop.run_in_executor(self.threads.search, fn), wait_s)
        except TimeoutError:
            # The thread stays in the call until the client's timeout frees it; the request does not wait.
            check_client(deadline, "the index answered")
            raise Unavailable(
                f"the index did not answer within the retrieval budget ({wait_s * 1000.0:.0f} ms)"
            ) from None

    async def _rerank(
        self, reranker: Reranker, query: str, passages: list[Passage], deadline: Deadline
    ) -> RerankOutcome:
        """Reorder under the Deadline; it decides depth before each batch. Never fails the request."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.threads.rerank, lambda: reranker.rerank(query, passages, deadline))

    async def warm_up(self, serving: ServingVersion) -> None:
        """The version's reranker measures its cost on the rerank threads (start-up)."""
        await asyncio.get_running_loop().run_in_executor(self.threads.rerank, serving.warm_up)
