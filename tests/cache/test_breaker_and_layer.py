"""The circuit breaker, and the layer's promise: a failing store is a miss, never an error."""

from __future__ import annotations

import asyncio

from ragserve.cache.base import CachedRetrieval
from ragserve.cache.circuit import BreakerState, CircuitBreaker
from ragserve.cache.keys import retrieval_key
from ragserve.cache.layer import StoreBackedCache
from ragserve.metrics import CACHE_CIRCUIT_OPEN, CACHE_ERRORS, CACHE_REQUESTS
from tests.fakes import FakeClock, FakeFlakyStore


def test_breaker_opens_after_consecutive_failures_and_probes_after_cooldown() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(failure_threshold=3, cooldown_s=2.0, clock=clock)
    breaker.record_failure()
    breaker.record_failure()
    breaker.record_success()  # not consecutive
    breaker.record_failure()
    breaker.record_failure()
    assert breaker.allow()
    breaker.record_failure()
    assert breaker.state is BreakerState.OPEN and not breaker.allow()
    assert not breaker.probe_due()
    clock.now += 2.0
    assert breaker.probe_due()
    assert not breaker.probe_due()  # one probe per cool-down
    assert breaker.state is BreakerState.HALF_OPEN and not breaker.allow()
    breaker.record_failure()  # the probe failed: open again for a full cool-down
    assert breaker.state is BreakerState.OPEN
    clock.now += 1.0
    assert not breaker.probe_due()
    clock.now += 1.0
    assert breaker.probe_due()
    breaker.record_success()
    assert breaker.allow()


def test_failing_store_is_a_miss_then_skipped_then_used_again() -> None:
    store = FakeFlakyStore()
    clock = FakeClock()
    cache = StoreBackedCache(store, ttl_s=60, breaker=CircuitBreaker(3, cooldown_s=5.0, clock=clock))
    key = retrieval_key("q", 3, "1", ("e",))
    entry = CachedRetrieval((), "1", (), "q")
    errors = CACHE_ERRORS.labels("fake", "connection")
    skipped = CACHE_REQUESTS.labels("fake", "skipped")

    async def body() -> None:
        await cache.start()
        cache.put(key, entry)
        await cache.drain()
        assert (await cache.get(key)) is not None

        store.down = True
        before_errors, before_skipped = errors._value.get(), skipped._value.get()
        for _ in range(3):
            assert await cache.get(key) is None  # counted, not raised
        assert cache.breaker.state is BreakerState.OPEN
        assert CACHE_CIRCUIT_OPEN.labels("fake")._value.get() == 1
        calls = store.calls
        for _ in range(10):
            assert await cache.get(key) is None
        assert store.calls == calls  # open: the store is not touched at all
        assert errors._value.get() - before_errors == 3
        assert skipped._value.get() - before_skipped == 10

        clock.now += 5.0
        assert await cache.get(key) is None  # starts a background probe, still skipped
        await asyncio.sleep(0)
        assert cache.breaker.state is BreakerState.OPEN  # the probe failed: store still down

        store.down = False
        clock.now += 5.0
        assert await cache.get(key) is None
        await asyncio.sleep(0.01)
        assert cache.breaker.state is BreakerState.CLOSED
        assert CACHE_CIRCUIT_OPEN.labels("fake")._value.get() == 0
        assert (await cache.get(key)) is not None
        await cache.close()

    asyncio.run(body())


def test_unreachable_at_start_opens_the_breaker_at_once() -> None:
    store = FakeFlakyStore()
    store.down = True
    cache = StoreBackedCache(store, ttl_s=60, breaker=CircuitBreaker(3, cooldown_s=60.0))

    async def body() -> None:
        await cache.start()  # does not raise
        assert cache.breaker.state is BreakerState.OPEN
        assert await cache.get(retrieval_key("q", 3, "1", ("e",))) is None
        await cache.close()

    asyncio.run(body())


def test_writes_are_bounded_and_never_raise() -> None:
    store = FakeFlakyStore()
    cache = StoreBackedCache(store, ttl_s=60, max_pending_writes=2)

    async def body() -> None:
        await cache.start()
        store.down = True
        for i in range(5):
            cache.put(retrieval_key(f"q{i}", 3, "1", ("e",)), CachedRetrieval((), "1", (), f"q{i}"))
        assert len(cache._pending) == 2  # the rest were dropped, not queued without limit
        await cache.drain()
        await cache.close()

    asyncio.run(body())


class FakeSlowStore(FakeFlakyStore):
    """Answers every get after `delay_s`: a store slower than the caller's budget, not a broken one."""

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s = delay_s

    async def get(self, key: str) -> bytes | None:
        await asyncio.sleep(self.delay_s)
        return await super().get(key)


def test_a_lookup_waits_no_longer_than_the_budget_left_and_does_not_blame_the_store() -> None:
    store = FakeSlowStore(delay_s=30.0)  # far slower than any host is late: only the budget ends the wait
    cache = StoreBackedCache(store, ttl_s=60, breaker=CircuitBreaker(1, cooldown_s=5.0, clock=FakeClock()))
    key = retrieval_key("q", 3, "1", ("e",))
    over_budget = CACHE_REQUESTS.labels("fake", "budget")

    async def body() -> None:
        cache.put(key, CachedRetrieval((), "1", (), "q"))
        await cache.drain()
        before = over_budget._value.get()
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await cache.get(key, timeout_s=0.02) is None  # the budget left: 20 ms
        assert loop.time() - started < 10  # a lookup that waited for the store would take 30 s
        assert over_budget._value.get() == before + 1
        assert cache.breaker.state is BreakerState.CLOSED  # slower than the budget is not a failure
        store.delay_s = 0.5  # still 25x the budget above
        assert await cache.get(key) is not None  # no budget given: the store's own pace

    asyncio.run(body())
