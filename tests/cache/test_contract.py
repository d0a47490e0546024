"""One contract, run against both stores: the in-process LRU and a real redis-server."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import redis

from ragserve.cache.base import CachedRetrieval
from ragserve.cache.keys import retrieval_key
from ragserve.cache.layer import StoreBackedCache
from ragserve.cache.memory import MemoryStore
from ragserve.cache.redis_cache import RedisStore
from ragserve.types import Chunk, Passage
from tests.cache.redis_proc import RedisProcess


def run(coro_fn: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(coro_fn())


def test_get_set_overwrite(make_store) -> None:
    async def body() -> None:
        store = make_store()
        await store.connect()
        assert await store.get("k1") is None
        await store.set("k1", b"one", ttl_s=60)
        assert await store.get("k1") == b"one"
        await store.set("k1", b"uno", ttl_s=60)
        assert await store.get("k1") == b"uno"
        assert await store.get("k2") is None
        await store.close()

    run(body)


def test_entries_expire_after_ttl(make_store) -> None:
    async def body() -> None:
        store = make_store()
        await store.set("short", b"x", ttl_s=0.15)
        await store.set("long", b"y", ttl_s=60)
        assert await store.get("short") == b"x"
        await asyncio.sleep(0.3)
        assert await store.get("short") is None
        assert await store.get("long") == b"y"
        await store.close()

    run(body)


def test_flush_drops_everything_and_counts(make_store) -> None:
    async def body() -> None:
        store = make_store()
        for i in range(7):
            await store.set(f"k{i}", b"v", ttl_s=60)
        assert await store.flush() == 7
        assert all([await store.get(f"k{i}") is None for i in range(7)])
        assert await store.flush() == 0
        await store.close()

    run(body)


def _entry(query: str, version: str = "1") -> CachedRetrieval:
    passages = tuple(
        Passage(Chunk(f"doc{i}#0", f"doc{i}", f"text {i} é ✓", f"Title {i}", f"doc{i}.md", 0, 10), 0.9 - i / 10, i + 1)
        for i in range(3)
    )
    return CachedRetrieval(passages, version, ("tier1:20",), query)


def test_layer_round_trips_an_entry_exactly(make_store) -> None:
    async def body() -> None:
        cache = StoreBackedCache(make_store(), ttl_s=60)
        await cache.start()
        key = retrieval_key("What  is\tTCP? ", 3, "1", ("embedder-a",))
        assert await cache.get(key) is None
        entry = _entry(key.query)
        cache.put(key, entry)
        await cache.drain()
        hit = await cache.get(key)
        assert hit is not None and hit.kind == "exact"
        assert hit.entry == entry
        # Normalization: the same query with other whitespace is the same key.
        assert await cache.get(retrieval_key("What is TCP?", 3, "1", ("embedder-a",))) is not None
        # Any other key part is another entry.
        for other in (
            retrieval_key("What is TCP?", 4, "1", ("embedder-a",)),
            retrieval_key("What is TCP?", 3, "2", ("embedder-a",)),
            retrieval_key("What is TCP?", 3, "1", ("embedder-b",)),
            retrieval_key("What is TCP?", 3, "1", ("embedder-a",), ("ef=128",)),
            retrieval_key("what is tcp?", 3, "1", ("embedder-a",)),
        ):
            assert await cache.get(other) is None, other
        assert await cache.flush() == 1
        assert await cache.get(key) is None
        await cache.close()

    run(body)


def test_a_corrupt_entry_is_a_miss(make_store) -> None:
    async def body() -> None:
        store = make_store()
        cache = StoreBackedCache(store, ttl_s=60)
        key = retrieval_key("q", 3, "1", ("e",))
        await store.set(key.storage_key, b"\x00not json", ttl_s=60)
        assert await cache.get(key) is None
        assert cache.breaker.allow()  # a bad entry says nothing about the backend's health
        await cache.close()

    run(body)


def test_memory_store_bounds_entries_and_bytes() -> None:
    async def body() -> None:
        store = MemoryStore(max_entries=3, max_bytes=10)
        for k in "abc":
            await store.set(k, b"12", ttl_s=60)
        assert await store.get("a") == b"12"  # a is now the most recently used
        await store.set("d", b"12", ttl_s=60)
        assert await store.get("b") is None and len(store) == 3
        await store.set("e", b"123456", ttl_s=60)  # 2+2+2+6 > 10 bytes: evict LRU until it fits
        assert store.size_bytes <= 10
        assert await store.get("e") == b"123456"
        await store.set("huge", b"x" * 11, ttl_s=60)  # larger than the whole bound: not stored
        assert await store.get("huge") is None

    run(body)


def test_redis_flush_leaves_other_namespaces_alone(redis_server: RedisProcess) -> None:
    other = redis.Redis(port=redis_server.port)
    other.set("someone-else:key", b"keep")

    async def body() -> None:
        store = RedisStore(redis_server.url, namespace="mine", timeout_s=1.0)
        await store.set("a", b"1", ttl_s=60)
        assert await store.flush() == 1
        await store.close()

    run(body)
    assert other.get("someone-else:key") == b"keep"
    assert other.ttl("someone-else:key") == -1
    other.close()


def test_redis_entries_carry_a_ttl(redis_server: RedisProcess) -> None:
    async def body() -> None:
        store = RedisStore(redis_server.url, namespace="ns", timeout_s=1.0)
        await store.set("a", b"1", ttl_s=30)
        await store.close()

    run(body)
    client = redis.Redis(port=redis_server.port)
    assert 0 < client.pttl("ns:a") <= 30_000
    client.close()
