"""Redis killed, paused and restarted mid-load: no request fails, the cache costs at most its timeout
per request while Redis is gone, and it is used again once Redis is back.

Load runs through the real pipeline (real MiniLM, real HNSW index) against a real redis-server.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from ragserve.budget import Deadline, RequestContext
from ragserve.cache.circuit import CircuitBreaker
from ragserve.cache.layer import StoreBackedCache
from ragserve.cache.redis_cache import RedisStore
from ragserve.factory import assemble_pipeline
from ragserve.index.hnsw import HnswIndex
from ragserve.metrics import CACHE_ERRORS, CACHE_REQUESTS
from ragserve.request.pipeline import RagPipeline
from ragserve.types import RetrieveParams
from tests.cache.redis_proc import RedisProcess

TIMEOUT_MS = 20.0
# Scheduling slack: on a shared, loaded 2-core host the event loop (which also has to win the GIL
# from the embedding and search threads) now and then resumes a coroutine up to ~100 ms late, for a
# successful Redis reply just as for a timeout. Without the outer timeout a stopped Redis would cost
# the 200 ms socket timeout (or more), so this bound still catches it; the typical timed-out lookup
# is checked tighter below.
SLACK_MS = 100.0
# Requests that must run while Redis is down (misses are slow on a loaded host: wait for them).
DURING_FAULT = 15
QUERIES = [
    line.strip()
    for line in (Path(__file__).resolve().parents[2] / "indexer" / "sample_questions.txt").read_text().splitlines()
    if line.strip()
][:6]


@dataclass
class Sample:
    at: float
    ok: bool
    cache_hit: bool
    cache_ms: float
    error: str = ""


@dataclass
class Load:
    samples: list[Sample] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    def between(self, start: float, end: float) -> list[Sample]:
        return [s for s in self.samples if start <= s.at < end]


async def _worker(pipeline: RagPipeline, load: Load, offset: int) -> None:
    i = offset
    while not load.stop.is_set():
        query = QUERIES[i % len(QUERIES)]
        i += 1
        try:
            result = await pipeline.retrieve(RetrieveParams(query, 3, 10_000), RequestContext(Deadline(10_000)))
            ok = bool(result.passages)
            load.samples.append(Sample(time.monotonic(), ok, result.cache_hit, result.timings.cache_ms))
        except Exception as exc:  # any failure is what this test looks for
            load.samples.append(Sample(time.monotonic(), False, False, 0.0, repr(exc)))
        await asyncio.sleep(0.005)


async def _until(predicate: Callable[[], bool], timeout_s: float) -> bool:
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        if predicate():
            return True
        await asyncio.sleep(0.05)
    return predicate()


def _run_fault(
    embedder,
    sample_index: Path,
    server: RedisProcess,
    inject: Callable[[], Awaitable[None]],
    recover: Callable[[], Awaitable[None]],
    max_fault_s: float = 60.0,
) -> tuple[Load, float, float, float]:
    """Warm up, inject the fault for a while, recover; returns the load and the phase times."""

    async def body() -> tuple[Load, float, float, float]:
        executor = ThreadPoolExecutor(2)
        store = RedisStore(server.url, namespace="fault", timeout_s=TIMEOUT_MS / 1000, connect_timeout_s=0.2)
        cache = StoreBackedCache(store, ttl_s=300, breaker=CircuitBreaker(3, cooldown_s=0.3))
        pipeline = assemble_pipeline(embedder, HnswIndex.load(sample_index), None, executor, cache=cache)
        await cache.start()
        load = Load()
        workers = [asyncio.create_task(_worker(pipeline, load, k)) for k in range(2)]
        try:
            assert await _until(lambda: sum(s.cache_hit for s in load.samples) >= 10, 30), "no hits before the fault"
            fault_at = time.monotonic()
            await inject()
            # Well past the breaker's threshold and several probe cool-downs, with enough requests.
            await asyncio.sleep(1.5)
            enough = await _until(lambda: len(load.between(fault_at, 1e18)) >= DURING_FAULT, max_fault_s - 1.5)
            assert enough, "too few requests during the fault"
            recover_at = time.monotonic()
            await recover()
            back = await _until(lambda: any(s.cache_hit for s in load.between(recover_at + 0.001, 1e18)), 15)
            assert back, "the cache was not used again after Redis came back"
            await asyncio.sleep(0.3)
        finally:
            load.stop.set()
            await asyncio.gather(*workers)
            await cache.close()
            executor.shutdown()
        return load, fault_at, recover_at, time.monotonic()

    return asyncio.run(body())


def _check(load: Load, fault_at: float, recover_at: float) -> None:
    failures = [s for s in load.samples if not s.ok]
    assert not failures, failures[:3]
    worst = max(s.cache_ms for s in load.samples)
    assert worst <= TIMEOUT_MS + SLACK_MS, f"a cache lookup took {worst:.1f} ms (timeout {TIMEOUT_MS} ms)"
    during = load.between(fault_at, recover_at)
    assert len(during) >= DURING_FAULT
    assert not any(s.cache_hit for s in during[5:]), "hits while Redis was down?"
    # The breaker skips Redis: most requests during the fault pay (almost) nothing for the cache.
    skipped = [s for s in during if s.cache_ms < 2.0]
    after = load.between(recover_at, 1e18)
    paid = sorted(s.cache_ms for s in during if s.cache_ms >= 2.0)  # the lookups that waited on Redis
    if len(paid) >= 3:
        assert paid[len(paid) // 2] <= TIMEOUT_MS + 15.0, paid
    print(
        f"\n{len(load.samples)} requests, 0 failed; worst cache lookup {worst:.1f} ms; during the fault "
        f"{len(during)} requests, {len(skipped)} skipped Redis; after recovery {sum(s.cache_hit for s in after)}"
        f"/{len(after)} hits"
    )
    assert len(skipped) >= len(during) // 2, [round(s.cache_ms, 1) for s in during]


def _counts() -> tuple[float, float]:
    errors = sum(CACHE_ERRORS.labels("redis", kind)._value.get() for kind in ("timeout", "connection", "protocol"))
    return errors, CACHE_REQUESTS.labels("redis", "skipped")._value.get()


@pytest.mark.slow  # load through a Redis outage of seconds
@pytest.mark.alone  # every cache lookup is bounded in ms: three other lanes on two cores stall it past that
def test_redis_killed_and_restarted(embedder, sample_index, redis_server: RedisProcess) -> None:
    errors0, skipped0 = _counts()

    async def inject() -> None:
        await asyncio.to_thread(redis_server.kill)  # waiting for the process must not block the loop

    async def recover() -> None:
        await asyncio.to_thread(redis_server.restart)  # same port, empty (no persistence)

    load, fault_at, recover_at, _ = _run_fault(embedder, sample_index, redis_server, inject, recover)
    _check(load, fault_at, recover_at)
    errors1, skipped1 = _counts()
    assert errors1 > errors0 and skipped1 > skipped0


@pytest.mark.slow  # load through a Redis outage of seconds
@pytest.mark.alone  # every cache lookup is bounded in ms: three other lanes on two cores stall it past that
def test_redis_sigstop_then_sigcont(embedder, sample_index, redis_server: RedisProcess) -> None:
    errors0, _ = _counts()

    async def inject() -> None:
        redis_server.pause()

    async def recover() -> None:
        redis_server.resume()

    load, fault_at, recover_at, _ = _run_fault(embedder, sample_index, redis_server, inject, recover)
    _check(load, fault_at, recover_at)
    # A stopped server accepts connections and never answers: only timeouts can bound that.
    assert CACHE_ERRORS.labels("redis", "timeout")._value.get() > 0
    assert _counts()[0] > errors0


@pytest.mark.slow  # load through a Redis outage of seconds
@pytest.mark.alone  # every cache lookup is bounded in ms: three other lanes on two cores stall it past that
def test_redis_client_pause(embedder, sample_index, redis_server: RedisProcess) -> None:
    admin = redis.Redis(port=redis_server.port)

    pause_ms = 6000

    async def inject() -> None:
        admin.execute_command("CLIENT", "PAUSE", pause_ms, "ALL")

    async def recover() -> None:
        # Redis 7.0 holds every command during CLIENT PAUSE ALL, UNPAUSE included: this returns
        # when the pause ends.
        await asyncio.to_thread(admin.execute_command, "CLIENT", "UNPAUSE")

    try:
        load, fault_at, recover_at, _ = _run_fault(
            embedder, sample_index, redis_server, inject, recover, max_fault_s=pause_ms / 1000 - 1.0
        )
    finally:
        admin.close()
    _check(load, fault_at, recover_at)


@pytest.mark.parametrize("url", ["redis://127.0.0.1:{closed}/0"])
def test_redis_refusing_connections_from_the_start(embedder, sample_index, url: str) -> None:
    from tests.helpers import free_port

    async def body() -> int:
        executor = ThreadPoolExecutor(2)
        store = RedisStore(url.format(closed=free_port()), timeout_s=TIMEOUT_MS / 1000)
        cache = StoreBackedCache(store, breaker=CircuitBreaker(3, cooldown_s=0.3))
        pipeline = assemble_pipeline(embedder, HnswIndex.load(sample_index), None, executor, cache=cache)
        await cache.start()  # logs and opens the breaker; does not raise
        _, skipped_before = _counts()
        for q in QUERIES * 2:
            result = await pipeline.retrieve(RetrieveParams(q, 3, 10_000), RequestContext(Deadline(10_000)))
            assert result.passages and not result.cache_hit
        _, skipped_after = _counts()
        await cache.close()
        executor.shutdown()
        return int(skipped_after - skipped_before)

    # Open from the start and never closed (its probes find nothing): no request asks Redis at all,
    # so none pays for it.
    assert asyncio.run(body()) == len(QUERIES) * 2
