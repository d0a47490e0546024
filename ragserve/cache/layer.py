"""The retrieval cache the pipeline uses: a store behind a circuit breaker, metrics, and no raising.

Every store failure becomes a miss: counted in CACHE_ERRORS, fed to the breaker, logged at most once
per breaker opening. Reads cost at most the store's timeout; writes run in the background (bounded
in number) so a miss never waits for the store either.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import numpy as np

from ragserve.cache.base import CacheBackendError, CachedRetrieval, CacheHit, CacheStore
from ragserve.cache.circuit import BreakerState, CircuitBreaker
from ragserve.cache.codec import decode_entry, encode_entry
from ragserve.cache.keys import RetrievalKey
from ragserve.cache.semantic import SemanticIndex
from ragserve.metrics import CACHE_CIRCUIT_OPEN, CACHE_ERRORS, CACHE_REQUESTS

log = logging.getLogger(__name__)


class StoreBackedCache:
    def __init__(
        self,
        store: CacheStore,
        ttl_s: float = 3600.0,
        degraded_ttl_s: float = 0.0,
        breaker: CircuitBreaker | None = None,
        semantic: SemanticIndex | None = None,
        max_pending_writes: int = 256,
    ) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self.degraded_ttl_s = degraded_ttl_s
        self.breaker = breaker or CircuitBreaker()
        self.semantic = semantic
        self.max_pending_writes = max_pending_writes
        self._pending: set[asyncio.Task[None]] = set()
        self._probe: asyncio.Task[None] | None = None
        self._started = False
        CACHE_CIRCUIT_OPEN.labels(store.name).set(0)

    @property
    def backend(self) -> str:
        return self.store.name

    @property
    def semantic_enabled(self) -> bool:
        return self.semantic is not None

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
        CACHE_ERRORS.labels(self.backend, exc.kind).inc()
        was_open = self.breaker.state is not BreakerState.CLOSED
        self.breaker.record_failure()
        if self.breaker.state is BreakerState.OPEN and not was_open:
            CACHE_CIRCUIT_OPEN.labels(self.backend).set(1)
            log.warning(
                "cache backend %s failing (%s on %s); skipping it for %.1f s, then probing",
                self.backend,
                exc,
                op,
                self.breaker.cooldown_s,
            )

    def _succeeded(self) -> None:
        if self.breaker.state is not BreakerState.CLOSED:
            log.info("cache backend %s is back in use", self.backend)
            CACHE_CIRCUIT_OPEN.labels(self.backend).set(0)
        self.breaker.record_success()

    def _spawn_probe(self, warm: bool) -> None:
        if self._probe is not None and not self._probe.done():
            return
        self._probe = asyncio.get_running_loop().create_task(self._run_probe(warm))

    async def _run_probe(self, warm: bool) -> None:
        try:
            await (self.store.connect() if warm else self.store.ping())
        except CacheBackendError as exc:
            CACHE_ERRORS.labels(self.backend, exc.kind).inc()
            self.breaker.trip()
            CACHE_CIRCUIT_OPEN.labels(self.backend).set(1)
            # At start-up say so once; a down backend is then probed quietly every cool-down.
            log.log(
                logging.WARNING if warm else logging.DEBUG,
                "cache backend %s unreachable (%s); serving without it, probing every %.1f s",
                self.backend,
                exc,
                self.breaker.cooldown_s,
            )
            return
        self._succeeded()

    # --- the RetrievalCache contract --------------------------------------------------------

    async def start(self) -> None:
        """Connect (and warm the pool) before serving; an unreachable store only opens the breaker."""
        self._started = True
        self._spawn_probe(warm=True)
        assert self._probe is not None
        await self._probe

    async def _read(self, storage_key: str) -> CachedRetrieval | None:
        try:
            raw = await self.store.get(storage_key)
            self._succeeded()
            return None if raw is None else decode_entry(raw)
        except CacheBackendError as exc:
            if exc.kind == "decode":
                CACHE_ERRORS.labels(self.backend, exc.kind).inc()  # a bad entry, not a bad backend
            else:
                self._failed(exc, "get")
            raise

    async def get(self, key: RetrievalKey) -> CacheHit | None:
        if not self._usable():
            CACHE_REQUESTS.labels(self.backend, "skipped").inc()
            return None
        try:
            entry = await self._read(key.storage_key)
        except CacheBackendError:
            CACHE_REQUESTS.labels(self.backend, "error").inc()
            return None
        if entry is None or entry.index_version != key.index_version:
            CACHE_REQUESTS.labels(self.backend, "miss").inc()
            return None
        CACHE_REQUESTS.labels(self.backend, "hit").inc()
        return CacheHit(entry, "exact")

    async def get_similar(self, key: RetrievalKey, query_vector: np.ndarray) -> CacheHit | None:
        if self.semantic is None:
            return None
        match = self.semantic.lookup(key, query_vector)
        if match.rejected:
            CACHE_REQUESTS.labels(self.backend, "semantic_rejected").inc()
        if match.key is None or not self._usable():
            return None
        try:
            entry = await self._read(match.key.storage_key)
        except CacheBackendError:
            CACHE_REQUESTS.labels(self.backend, "error").inc()
            return None
        if entry is None or entry.index_version != key.index_version:
            return None
        CACHE_REQUESTS.labels(self.backend, "semantic_hit").inc()
        return CacheHit(entry, "semantic")

    def put(self, key: RetrievalKey, entry: CachedRetrieval, query_vector: np.ndarray | None = None) -> None:
        # A ranking cut short by the budget would otherwise be served for a whole TTL: by default it
        # is not stored at all; a short degraded TTL trades that for hits on an overloaded host.
        ttl_s = self.degraded_ttl_s if entry.degraded else self.ttl_s
        if ttl_s <= 0 or not self._usable():
            return
        if len(self._pending) >= self.max_pending_writes:
            CACHE_ERRORS.labels(self.backend, "write_dropped").inc()
            return
        if self.semantic is not None and query_vector is not None and not entry.degraded:
            self.semantic.add(key, query_vector)
        task = asyncio.get_running_loop().create_task(self._write(key.storage_key, encode_entry(entry), ttl_s))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _write(self, storage_key: str, value: bytes, ttl_s: float) -> None:
        try:
            await self.store.set(storage_key, value, ttl_s)
        except CacheBackendError as exc:
            self._failed(exc, "set")
            return
        self._succeeded()

    async def drain(self) -> None:
        """Wait for the background writes scheduled so far (tests, benchmarks, shutdown)."""
        while self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)

    async def flush(self) -> int:
        """Drop every entry (raises CacheBackendError if the store cannot be reached: an operator call)."""
        await self.drain()
        if self.semantic is not None:
            self.semantic.clear()
        return await self.store.flush()

    async def close(self) -> None:
        await self.drain()
        if self._probe is not None and not self._probe.done():
            self._probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe
        await self.store.close()
