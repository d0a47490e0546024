"""A cache store behind a circuit breaker, metrics, and no raising: what both caches share.

Every store failure becomes a miss: counted in the cache's error counter, fed to the breaker, logged
at most once per breaker opening. Reads cost at most the store's timeout; writes run in the
background (bounded in number) so a miss never waits for the store either.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from prometheus_client import Counter, Gauge

from ragserve.cache.base import (
    CacheBackendError,
    CacheStore,
    RejectedEntry,
)
from ragserve.cache.circuit import BreakerState, CircuitBreaker
from ragserve.cache.integrity import EntrySeal
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

log = logging.getLogger(__name__)


class _Versioned(Protocol):
    @property
    def index_version(self) -> str: ...


# An entry as a store hands it back: it names the index version it was made for.
E = TypeVar("E", bound=_Versioned)


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
