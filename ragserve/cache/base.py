"""The retrieval cache contracts: what the pipeline sees, and the byte stores behind it.

The pipeline talks to a `RetrievalCache`. The one implementation (`cache.layer.StoreBackedCache`)
owns the failure handling (timeouts, circuit breaker, metrics) and the optional semantic layer, and
keeps entries in a `CacheStore`: the in-process LRU or Redis. Both stores pass one contract suite.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from ragserve.cache.keys import RetrievalKey
from ragserve.types import Passage


class CacheBackendError(Exception):
    """A store could not answer (down, paused, refusing, timed out). Never reaches a caller.

    `kind` labels the failure in CACHE_ERRORS: timeout, connection, protocol, decode.
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind


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


@runtime_checkable
class RetrievalCache(Protocol):
    """What the pipeline uses. No method raises: a failing backend behaves as a miss."""

    @property
    def backend(self) -> str: ...

    @property
    def semantic_enabled(self) -> bool: ...

    async def get(self, key: RetrievalKey) -> CacheHit | None: ...

    async def get_similar(self, key: RetrievalKey, query_vector: np.ndarray) -> CacheHit | None:
        """A near-duplicate query's entry that the meaning guard accepts, else None."""
        ...

    def put(self, key: RetrievalKey, entry: CachedRetrieval, query_vector: np.ndarray | None = None) -> None:
        """Schedule a write; the request does not wait for it."""
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
