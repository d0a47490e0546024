"""The caches the pipeline uses: the retrieval cache (`StoreBackedCache`) and the answer cache
(`StoreBackedAnswerCache`), each its entries, keys and policies on top of a guarded store
(cache/guarded.py: the breaker, metrics, bounded background writes, and no raising)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ragserve.cache.base import (
    CachedAnswer,
    CachedRetrieval,
    CacheHit,
    CacheStore,
    RejectedEntry,
)
from ragserve.cache.circuit import CircuitBreaker
from ragserve.cache.codec import decode_answer, decode_entry, encode_answer, encode_entry
from ragserve.cache.guarded import ANSWER_METRICS, RETRIEVAL_METRICS, E, GuardedStore
from ragserve.cache.integrity import EntrySeal
from ragserve.cache.keys import AnswerKey, RetrievalKey
from ragserve.cache.semantic import SemanticIndex, SemanticMatch
from ragserve.config import CacheSettings, default_of

# Answer text kept per entry: a longer answer is served from the engine every time (it is rare,
# and a few large entries would otherwise crowd many small ones out of the in-process LRU).
MAX_ANSWER_BYTES = 64 * 1024


def _expect(entry: E, index_version: str) -> E:
    # The version is in the key too; checking it again guards against a reused or planted key.
    if entry.index_version != index_version:
        raise RejectedEntry("index_version", f"entry for index {entry.index_version!r}, key for {index_version!r}")
    return entry


class StoreBackedCache(GuardedStore):
    """The retrieval cache: reranked passage lists, with the optional semantic layer.

    Semantic lookups run on one worker thread of their own: the guard is Python and may take a few
    milliseconds over its bounded candidates, which the event loop must not wait for.
    """

    def __init__(
        self,
        store: CacheStore,
        ttl_s: float = default_of(CacheSettings, "ttl_s"),
        degraded_ttl_s: float = default_of(CacheSettings, "degraded_ttl_s"),
        breaker: CircuitBreaker | None = None,
        semantic: SemanticIndex | None = None,
        max_pending_writes: int = 256,
        seal: EntrySeal | None = None,
    ) -> None:
        super().__init__(store, RETRIEVAL_METRICS, breaker, max_pending_writes, seal)
        self.ttl_s = ttl_s
        self.degraded_ttl_s = degraded_ttl_s
        self.semantic = semantic
        # One thread: concurrent lookups queue rather than take more than one core between them.
        self._semantic_executor: ThreadPoolExecutor | None = None

    @property
    def semantic_enabled(self) -> bool:
        return self.semantic is not None

    @staticmethod
    def _decoder(key: RetrievalKey) -> Callable[[bytes], CachedRetrieval]:
        def decode(payload: bytes) -> CachedRetrieval:
            entry = _expect(decode_entry(payload, key.top_k), key.index_version)
            if entry.query != key.query:
                raise RejectedEntry("query", "the entry was stored for another query")
            return entry

        return decode

    # --- the RetrievalCache contract --------------------------------------------------------

    async def get(self, key: RetrievalKey, timeout_s: float | None = None) -> CacheHit | None:
        entry = await self._get_current(key.storage_key, self._decoder(key), timeout_s)
        return None if entry is None else CacheHit(entry, "exact")

    async def _semantic_lookup(self, semantic: SemanticIndex, key: RetrievalKey, vector: np.ndarray) -> SemanticMatch:
        if len(semantic) == 0:
            return SemanticMatch(None, 0.0, "")  # nothing to compare: no thread hop
        if self._semantic_executor is None:
            self._semantic_executor = ThreadPoolExecutor(1, thread_name_prefix="ragserve-semantic")
        return await asyncio.get_running_loop().run_in_executor(self._semantic_executor, semantic.lookup, key, vector)

    async def get_similar(
        self, key: RetrievalKey, query_vector: np.ndarray, timeout_s: float | None = None
    ) -> CacheHit | None:
        if self.semantic is None:
            return None
        match = await self._semantic_lookup(self.semantic, key, query_vector)
        if match.rejected:
            self._count("semantic_rejected")
        if match.key is None or not self._usable():
            return None
        result, entry = await self._fetch(match.key.storage_key, self._decoder(match.key), timeout_s)
        if result in ("error", "budget"):
            self._count(result)
        if entry is None or entry.index_version != key.index_version:
            return None
        self._count("semantic_hit")
        return CacheHit(entry, "semantic")

    def put(self, key: RetrievalKey, entry: CachedRetrieval, query_vector: np.ndarray | None = None) -> None:
        """`query_vector`: None when the query must not be matched semantically (e.g. it did not fit
        the embedder's token window)."""
        # A ranking cut short by the budget would otherwise be served for a whole TTL: by default it
        # is not stored at all; a short degraded TTL trades that for hits on an overloaded host.
        ttl_s = self.degraded_ttl_s if entry.degraded else self.ttl_s
        if ttl_s <= 0 or not self._usable():
            return
        scheduled = self._schedule_sealed(key.storage_key, encode_entry(entry), ttl_s)
        if scheduled and self.semantic is not None and query_vector is not None and not entry.degraded:
            self.semantic.add(key, query_vector)

    async def flush(self) -> int:
        if self.semantic is not None:
            self.semantic.clear()
        return await super().flush()

    async def close(self) -> None:
        await super().close()
        if self._semantic_executor is not None:
            self._semantic_executor.shutdown(wait=False, cancel_futures=True)
            self._semantic_executor = None


class StoreBackedAnswerCache(GuardedStore):
    """The answer cache: the streamed text of clean temperature-0 answers, with their passages.

    The pipeline decides what a clean answer is (finish "stop", retrieval not degraded, temperature
    0); this layer adds the size cap and counts "stored" once a write has landed.
    """

    def __init__(
        self,
        store: CacheStore,
        ttl_s: float = default_of(CacheSettings, "answer_ttl_s"),
        breaker: CircuitBreaker | None = None,
        max_pending_writes: int = 256,
        max_text_bytes: int = MAX_ANSWER_BYTES,
        seal: EntrySeal | None = None,
    ) -> None:
        super().__init__(store, ANSWER_METRICS, breaker, max_pending_writes, seal)
        self.ttl_s = ttl_s
        self.max_text_bytes = max_text_bytes

    async def get(self, key: AnswerKey, timeout_s: float | None = None) -> CachedAnswer | None:
        def decode(payload: bytes) -> CachedAnswer:
            entry = _expect(decode_answer(payload, key.top_k), key.index_version)
            if len(entry.text.encode()) > self.max_text_bytes:
                raise RejectedEntry("out_of_bounds", "answer text over the size cap")
            return entry

        return await self._get_current(key.storage_key, decode, timeout_s)

    def put(self, key: AnswerKey, entry: CachedAnswer) -> None:
        if not entry.text:
            return  # nothing to replay
        if len(entry.text.encode()) > self.max_text_bytes:
            self._error("too_large")
            return
        if self._usable():
            self._schedule_sealed(key.storage_key, encode_answer(entry), self.ttl_s, stored="stored")
