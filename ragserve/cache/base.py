"""The cache contracts: what the pipeline sees, and the byte stores behind them.

The pipeline talks to a `RetrievalCache` (passage lists) and an `AnswerCache` (answer text). Their
implementations (`cache.layer`) share the failure handling (timeouts, circuit breaker, metrics) and
keep entries in a `CacheStore`: the in-process LRU or Redis. Both stores pass one contract suite.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from ragserve.cache.keys import AnswerKey, RetrievalKey
from ragserve.events import Usage
from ragserve.types import Degraded, Passage, RetrievalResult, StageTimings


class CacheBackendError(Exception):
    """A store could not answer (down, paused, refusing, timed out). Never reaches a caller.

    `kind` labels the failure in CACHE_ERRORS: timeout, connection, protocol.
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind


class RejectedEntry(Exception):
    """A stored entry this process will not serve; the lookup is a miss. Never reaches a caller.

    `reason` labels it in the rejected-entries counter: too_large, unauthenticated, malformed,
    out_of_bounds, index_version, query.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason


@dataclass(frozen=True, slots=True)
class CachedRetrieval:
    """The reranked passage list of one request, as stored; timings are always fresh on a hit."""

    passages: tuple[Passage, ...]
    index_version: str
    rerank_tiers: tuple[str, ...] = ()
    # The normalized query that produced it (for the semantic guard and for debugging).
    query: str = ""
    # The ranking was cut short by the budget (kept only with the short degraded TTL, if any).
    degraded: bool = False


@dataclass(frozen=True, slots=True)
class CacheHit:
    entry: CachedRetrieval
    # "exact" or "semantic"
    kind: str

    def result(self, identity: str, timings: StageTimings) -> RetrievalResult:
        """The hit as this request's retrieval. It was found under a key of `identity` (it is in
        the scope), so it is that index's."""
        entry = self.entry
        return RetrievalResult(
            list(entry.passages),
            timings,
            Degraded.of_cache_hit(self.kind == "semantic", entry.degraded),
            entry.index_version,
            list(entry.rerank_tiers),
            cache_hit=True,
            index_identity=identity,
        )


@runtime_checkable
class RetrievalCache(Protocol):
    """What the pipeline uses. No method raises: a failing backend behaves as a miss."""

    @property
    def backend(self) -> str: ...

    @property
    def semantic_enabled(self) -> bool: ...

    async def get(self, key: RetrievalKey, timeout_s: float | None = None) -> CacheHit | None:
        """`timeout_s`: the most the caller will wait (what is left of its budget); then a miss."""
        ...

    async def get_similar(
        self, key: RetrievalKey, query_vector: np.ndarray, timeout_s: float | None = None
    ) -> CacheHit | None:
        """A near-duplicate query's entry that the meaning guard accepts, else None."""
        ...

    def put(self, key: RetrievalKey, entry: CachedRetrieval, query_vector: np.ndarray | None = None) -> None:
        """Schedule a write; the request does not wait for it."""
        ...

    async def start(self) -> None: ...

    async def flush(self) -> int: ...

    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class CachedAnswer:
    """A clean temperature-0 answer and the passages it was generated from (the ones it cites)."""

    text: str
    passages: tuple[Passage, ...]
    index_version: str
    rerank_tiers: tuple[str, ...]
    # The original run's usage: what the answer cost when the engine made it.
    usage: Usage
    generator_model: str
    context_tokens: int = 0
    context_tokens_full: int = 0


@runtime_checkable
class AnswerCache(Protocol):
    """What the pipeline uses for answers. No method raises: a failing backend behaves as a miss."""

    @property
    def backend(self) -> str: ...

    async def get(self, key: AnswerKey, timeout_s: float | None = None) -> CachedAnswer | None: ...

    def put(self, key: AnswerKey, entry: CachedAnswer) -> None:
        """Schedule a write of a clean answer (the caller decides what is clean); never waits."""
        ...

    async def start(self) -> None: ...

    async def flush(self) -> int: ...

    async def close(self) -> None: ...


@runtime_checkable
class CacheStore(Protocol):
    """Bytes by key with a TTL. Every failure is raised as CacheBackendError, within `timeout`."""

    @property
    def name(self) -> str: ...

    async def get(self, key: str) -> bytes | None: ...

    async def set(self, key: str, value: bytes, ttl_s: float) -> None: ...

    async def ping(self) -> None: ...

    async def connect(self) -> None:
        """Open (and warm) connections ahead of the first request; no-op in process."""
        ...

    async def flush(self) -> int:
        """Drop every entry of this cache's namespace; returns how many were dropped."""
        ...

    async def close(self) -> None: ...
