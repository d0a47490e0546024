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
from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np
from prometheus_client import Counter, Gauge

from ragserve.cache.base import CacheBackendError, CachedAnswer, CachedRetrieval, CacheHit, CacheStore
from ragserve.cache.circuit import BreakerState, CircuitBreaker
from ragserve.cache.codec import decode_answer, decode_entry, encode_answer, encode_entry
from ragserve.cache.keys import AnswerKey, RetrievalKey
from ragserve.cache.semantic import SemanticIndex
from ragserve.metrics import (
    ANSWER_CACHE_CIRCUIT_OPEN,
    ANSWER_CACHE_ERRORS,
    ANSWER_CACHE_REQUESTS,
    CACHE_CIRCUIT_OPEN,
    CACHE_ERRORS,
    CACHE_REQUESTS,
)

T = TypeVar("T")


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


RETRIEVAL_METRICS = CacheMetrics("retrieval cache", CACHE_REQUESTS, CACHE_ERRORS, CACHE_CIRCUIT_OPEN)
ANSWER_METRICS = CacheMetrics("answer cache", ANSWER_CACHE_REQUESTS, ANSWER_CACHE_ERRORS, ANSWER_CACHE_CIRCUIT_OPEN)


class GuardedStore:
    """A CacheStore behind a circuit breaker, with metrics and bounded background writes.

    Only `flush` raises (an operator call); every request-path failure is counted and becomes a miss.
    """

    def __init__(
        self,
        store: CacheStore,
        metrics: CacheMetrics,
        breaker: CircuitBreaker | None = None,
        max_pending_writes: int = 256,
    ) -> None:
        self.store = store
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

    async def _read(self, storage_key: str, decode: Callable[[bytes], T]) -> T | None:
        """Raises CacheBackendError, already counted (and fed to the breaker unless it is a bad entry)."""
        try:
            raw = await self.store.get(storage_key)
            self._succeeded()
            return None if raw is None else decode(raw)
        except CacheBackendError as exc:
            if exc.kind == "decode":
                self._error(exc.kind)  # a bad entry, not a bad backend
            else:
                self._failed(exc, "get")
            raise

    async def _get_current(self, storage_key: str, index_version: str, decode: Callable[[bytes], E]) -> E | None:
        """An exact lookup, counted as skipped, error, miss or hit; another index version's entry is a miss."""
        if not self._usable():
            self._count("skipped")
            return None
        try:
            entry = await self._read(storage_key, decode)
        except CacheBackendError:
            self._count("error")
            return None
        # The version is in the key too; checking it again guards against a reused or mangled key.
        if entry is None or entry.index_version != index_version:
            self._count("miss")
            return None
        self._count("hit")
        return entry

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


class StoreBackedCache(GuardedStore):
    """The retrieval cache: reranked passage lists, with the optional semantic layer."""

    def __init__(
        self,
        store: CacheStore,
        ttl_s: float = 3600.0,
        degraded_ttl_s: float = 0.0,
        breaker: CircuitBreaker | None = None,
        semantic: SemanticIndex | None = None,
        max_pending_writes: int = 256,
    ) -> None:
        super().__init__(store, RETRIEVAL_METRICS, breaker, max_pending_writes)
        self.ttl_s = ttl_s
        self.degraded_ttl_s = degraded_ttl_s
        self.semantic = semantic

    @property
    def semantic_enabled(self) -> bool:
        return self.semantic is not None

    # --- the RetrievalCache contract --------------------------------------------------------

    async def get(self, key: RetrievalKey) -> CacheHit | None:
        entry = await self._get_current(key.storage_key, key.index_version, decode_entry)
        return None if entry is None else CacheHit(entry, "exact")

    async def get_similar(self, key: RetrievalKey, query_vector: np.ndarray) -> CacheHit | None:
        if self.semantic is None:
            return None
        match = self.semantic.lookup(key, query_vector)
        if match.rejected:
            self._count("semantic_rejected")
        if match.key is None or not self._usable():
            return None
        try:
            entry = await self._read(match.key.storage_key, decode_entry)
        except CacheBackendError:
            self._count("error")
            return None
        if entry is None or entry.index_version != key.index_version:
            return None
        self._count("semantic_hit")
        return CacheHit(entry, "semantic")

    def put(self, key: RetrievalKey, entry: CachedRetrieval, query_vector: np.ndarray | None = None) -> None:
        # A ranking cut short by the budget would otherwise be served for a whole TTL: by default it
        # is not stored at all; a short degraded TTL trades that for hits on an overloaded host.
        ttl_s = self.degraded_ttl_s if entry.degraded else self.ttl_s
        if ttl_s <= 0 or not self._usable():
            return
        scheduled = self._schedule_write(key.storage_key, encode_entry(entry), ttl_s)
        if scheduled and self.semantic is not None and query_vector is not None and not entry.degraded:
            self.semantic.add(key, query_vector)

    async def flush(self) -> int:
        if self.semantic is not None:
            self.semantic.clear()
        return await super().flush()


class StoreBackedAnswerCache(GuardedStore):
    """The answer cache: the streamed text of clean temperature-0 answers, with their passages.

    The pipeline decides what a clean answer is (finish "stop", retrieval not degraded, temperature
    0); this layer adds the size cap and counts "stored" once a write has landed.
    """

    def __init__(
        self,
        store: CacheStore,
        ttl_s: float = 3600.0,
        breaker: CircuitBreaker | None = None,
        max_pending_writes: int = 256,
        max_text_bytes: int = MAX_ANSWER_BYTES,
    ) -> None:
        super().__init__(store, ANSWER_METRICS, breaker, max_pending_writes)
        self.ttl_s = ttl_s
        self.max_text_bytes = max_text_bytes

    async def get(self, key: AnswerKey) -> CachedAnswer | None:
        return await self._get_current(key.storage_key, key.index_version, decode_answer)

    def put(self, key: AnswerKey, entry: CachedAnswer) -> None:
        if not entry.text:
            return  # nothing to replay
        if len(entry.text.encode()) > self.max_text_bytes:
            self._error("too_large")
            return
        if self._usable():
            self._schedule_write(key.storage_key, encode_answer(entry), self.ttl_s, stored="stored")
