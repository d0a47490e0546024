"""The caches the pipeline uses: a store behind a circuit breaker, metrics, and no raising.

Every store failure becomes a miss: counted in the cache's error counter, fed to the breaker, logged
at most once per breaker opening. Reads cost at most the store's timeout; writes run in the
background (bounded in number) so a miss never waits for the store either. `GuardedStore` holds
that machinery once; the retrieval cache (`StoreBackedCache`) and the answer cache
(`StoreBackedAnswerCache`) add only their entries, keys and policies on top.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np
from prometheus_client import Counter, Gauge

from ragserve.cache.base import (
    CacheBackendError,
    CachedAnswer,
    CachedRetrieval,
    CacheHit,
    CacheStore,
    RejectedEntry,
)
from ragserve.cache.circuit import BreakerState, CircuitBreaker
from ragserve.cache.codec import decode_answer, decode_entry, encode_answer, encode_entry
from ragserve.cache.integrity import EntrySeal
from ragserve.cache.keys import AnswerKey, RetrievalKey
from ragserve.cache.semantic import SemanticIndex, SemanticMatch
from ragserve.config import CacheSettings, default_of
from ragserve.metrics import (
    ANSWER_CACHE_CIRCUIT_OPEN,
    ANSWER_CACHE_ERRORS,
    ANSWER_CACHE_REJECTED,
    ANSWER_CACHE_REQUESTS,
    CACHE_CIRCUIT_OPEN,
    CACHE_ERRORS,
    CACHE_REJECTED,
    CACHE_REQUESTS,
)


class _Versioned(Protocol):
    @property
    def index_version(self) -> str: ...


E = TypeVar("E", bound=_Versioned)

log = logging.getLogger(__name__)

# Answer text kept per entry: a longer answer is served from the engine every time (it is rare,
# and a few large entries would otherwise crowd many small ones out of the in-process LRU).
MAX_ANSWER_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class CacheMetrics:
    """The series one cache reports into: the retrieval and the answer cache each have their own."""

    what: str  # for log lines
    requests: Counter
    errors: Counter
    circuit_open: Gauge
    rejected: Counter


RETRIEVAL_METRICS = CacheMetrics("retrieval cache", CACHE_REQUESTS, CACHE_ERRORS, CACHE_CIRCUIT_OPEN, CACHE_REJECTED)
ANSWER_METRICS = CacheMetrics(
    "answer cache", ANSWER_CACHE_REQUESTS, ANSWER_CACHE_ERRORS, ANSWER_CACHE_CIRCUIT_OPEN, ANSWER_CACHE_REJECTED
)


class GuardedStore:
    """A CacheStore behind a circuit breaker, with metrics and bounded background writes.

    Only `flush` raises (an operator call); every request-path failure is counted and becomes a miss.
    Nothing read from the store is trusted: an entry must pass `seal` (size cap, MAC if keyed) and
    its decoder's checks, or it is refused (counted by reason) and the lookup is a miss.
    """

    def __init__(
        self,
        store: CacheStore,
        metrics: CacheMetrics,
        breaker: CircuitBreaker | None = None,
        max_pending_writes: int = 256,
        seal: EntrySeal | None = None,
    ) -> None:
        self.store = store
        self.seal = seal or EntrySeal()
        self.breaker = breaker or CircuitBreaker()
        self.max_pending_writes = max_pending_writes
        self.metrics = metrics
        self._pending: set[asyncio.Task[None]] = set()
        self._probe: asyncio.Task[None] | None = None
        self._started = False
        metrics.circuit_open.labels(store.name).set(0)

    @property
    def backend(self) -> str:
        return self.store.name

    def _count(self, result: str) -> None:
        self.metrics.requests.labels(self.backend, result).inc()

    def _error(self, kind: str) -> None:
        self.metrics.errors.labels(self.backend, kind).inc()

    # --- failure handling -------------------------------------------------------------------

    def _usable(self) -> bool:
        if not self._started:
            # No explicit start(): warm the connections in the background on first use.
            self._started = True
            self._spawn_probe(warm=True)
        if self.breaker.allow():
            return True
        if self.breaker.probe_due():
            self._spawn_probe(warm=False)
        return False

    def _failed(self, exc: CacheBackendError, op: str) -> None:
        self._error(exc.kind)
        was_open = self.breaker.state is not BreakerState.CLOSED
        self.breaker.record_failure()
        if self.breaker.state is BreakerState.OPEN and not was_open:
            self.metrics.circuit_open.labels(self.backend).set(1)
            log.warning(
                "%s backend %s failing (%s on %s); skipping it for %.1f s, then probing",
                self.metrics.what,
                self.backend,
                exc,
                op,
                self.breaker.cooldown_s,
            )

    def _succeeded(self) -> None:
        if self.breaker.state is not BreakerState.CLOSED:
            log.info("%s backend %s is back in use", self.metrics.what, self.backend)
            self.metrics.circuit_open.labels(self.backend).set(0)
        self.breaker.record_success()

    def _spawn_probe(self, warm: bool) -> None:
        if self._probe is not None and not self._probe.done():
            return
        self._probe = asyncio.get_running_loop().create_task(self._run_probe(warm))

    async def _run_probe(self, warm: bool) -> None:
        try:
            await (self.store.connect() if warm else self.store.ping())
        except CacheBackendError as exc:
            self._error(exc.kind)
            self.breaker.trip()
            self.metrics.circuit_open.labels(self.backend).set(1)
            # At start-up say so once; a down backend is then probed quietly every cool-down.
            log.log(
                logging.WARNING if warm else logging.DEBUG,
                "%s backend %s unreachable (%s); serving without it, probing every %.1f s",
                self.metrics.what,
                self.backend,
                exc,
                self.breaker.cooldown_s,
            )
            return
        self._succeeded()

    async def start(self) -> None:
        """Connect (and warm the pool) before serving; an unreachable store only opens the breaker."""
        self._started = True
        self._spawn_probe(warm=True)
        assert self._probe is not None
        await self._probe

    async def _fetch(
        self, storage_key: str, decode: Callable[[bytes], E], timeout_s: float | None = None
    ) -> tuple[str, E | None]:
        """("hit", entry), or ("miss" | "error" | "rejected" | "budget", None): a store failure is
        counted and fed to the breaker; a refused entry is counted by reason (it says nothing about
        the store); a lookup that outlived the caller's `timeout_s` (its budget, not the store's own
        timeout) says nothing about the store either."""
        try:
            async with asyncio.timeout(timeout_s):
                raw = await self.store.get(storage_key)
        except TimeoutError:
            return "budget", None
        except CacheBackendError as exc:
            self._failed(exc, "get")
            return "error", None
        self._succeeded()
        if raw is None:
            return "miss", None
        try:
            return "hit", decode(self.seal.open(storage_key, raw))
        except RejectedEntry as exc:
            self.metrics.rejected.labels(self.backend, exc.reason).inc()
            log.debug("%s entry %s refused: %s", self.metrics.what, storage_key, exc)
            return "rejected", None

    async def _get_current(
        self, storage_key: str, decode: Callable[[bytes], E], timeout_s: float | None = None
    ) -> E | None:
        """An exact lookup, counted as skipped, error, budget, miss or hit (a refused entry is a miss)."""
        if not self._usable():
            self._count("skipped")
            return None
        result, entry = await self._fetch(storage_key, decode, timeout_s)
        self._count("miss" if result == "rejected" else result)
        return entry

    def _schedule_sealed(self, storage_key: str, payload: bytes, ttl_s: float, stored: str = "") -> bool:
        """Seal and schedule a write; an entry over the size cap is dropped (counted as too_large)."""
        raw = self.seal.seal(storage_key, payload)
        if raw is None:
            self._error("too_large")
            return False
        return self._schedule_write(storage_key, raw, ttl_s, stored)

    def _schedule_write(self, storage_key: str, value: bytes, ttl_s: float, stored: str = "") -> bool:
        """Write in the background (False: dropped); `stored`, if given, is counted once it has landed."""
        if len(self._pending) >= self.max_pending_writes:
            self._error("write_dropped")
            return False
        task = asyncio.get_running_loop().create_task(self._write(storage_key, value, ttl_s, stored))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        return True

    async def _write(self, storage_key: str, value: bytes, ttl_s: float, stored: str) -> None:
        try:
            await self.store.set(storage_key, value, ttl_s)
        except CacheBackendError as exc:
            self._failed(exc, "set")
            return
        self._succeeded()
        if stored:
            self._count(stored)

    async def drain(self) -> None:
        """Wait for the background writes scheduled so far (tests, benchmarks, shutdown)."""
        while self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)

    async def flush(self) -> int:
        """Drop every entry (raises CacheBackendError if the store cannot be reached: an operator call)."""
        await self.drain()
        return await self.store.flush()

    async def close(self) -> None:
        await self.drain()
        if self._probe is not None and not self._probe.done():
            self._probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe
        await self.store.close()


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
