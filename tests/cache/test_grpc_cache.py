"""The caches over the real gRPC server path: flags and timings in the response, Redis faults invisible."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from ragserve.cache.circuit import CircuitBreaker
from ragserve.cache.layer import StoreBackedAnswerCache, StoreBackedCache
from ragserve.cache.memory import MemoryStore
from ragserve.cache.redis_cache import RedisStore
from ragserve.client import RagClient
from ragserve.factory import assemble_pipeline
from ragserve.index.hnsw import HnswIndex
from ragserve.metrics import CACHE_REQUESTS
from tests.cache.inproc_server import serve_pipeline
from tests.cache.redis_proc import RedisProcess
from tests.fakes import FakeGenerator

Q = "Explain how a Bloom filter answers membership queries."
# Generous: a miss cut short by the budget is not cached, and misses are slow on a loaded host.
BUDGET_MS = 10_000


def test_retrieve_reports_cache_hits_over_grpc(embedder, sample_index) -> None:
    async def body() -> None:
        executor = ThreadPoolExecutor(2)
        cache = StoreBackedCache(MemoryStore())
        pipeline = assemble_pipeline(embedder, HnswIndex.load(sample_index), None, executor, cache=cache)
        async with serve_pipeline(pipeline) as target, RagClient(target) as client:
            miss = await client.retrieve(Q, top_k=3, budget_ms=BUDGET_MS)
            await cache.drain()
            hit = await client.retrieve(Q, top_k=3, budget_ms=BUDGET_MS)
        executor.shutdown()
        assert not miss.cache_hit and miss.timings.embed_ms > 0
        assert hit.cache_hit and hit.timings.embed_ms == 0 and hit.timings.cache_ms > 0
        assert [p.chunk_id for p in hit.passages] == [p.chunk_id for p in miss.passages]
        assert [p.score for p in hit.passages] == [p.score for p in miss.passages]
        assert hit.index_version == miss.index_version

    asyncio.run(body())


def test_redis_dies_and_returns_under_grpc_load(embedder, sample_index, redis_server: RedisProcess) -> None:
    async def body() -> None:
        executor = ThreadPoolExecutor(2)
        # A killed Redis refuses at once, so no short timeout is needed to see it go; 20 ms timed
        # out a live one under CI's other lanes (load 6 on two cores).
        store = RedisStore(redis_server.url, namespace="grpc", timeout_s=0.5)
        cache = StoreBackedCache(store, breaker=CircuitBreaker(3, cooldown_s=0.2))
        skipped = CACHE_REQUESTS.labels("redis", "skipped")
        pipeline = assemble_pipeline(embedder, HnswIndex.load(sample_index), None, executor, cache=cache)
        await cache.start()
        async with serve_pipeline(pipeline) as target, RagClient(target, default_timeout_s=10) as client:
            await client.retrieve(Q, top_k=3, budget_ms=BUDGET_MS)
            await cache.drain()
            assert (await client.retrieve(Q, top_k=3, budget_ms=BUDGET_MS)).cache_hit

            redis_server.kill()
            skipped_before = skipped._value.get()
            down = [await client.retrieve(Q, top_k=3, budget_ms=BUDGET_MS) for _ in range(10)]
            assert all(r.passages and not r.cache_hit for r in down)
            # The breaker opened after at most 3 failed calls: the other lookups did not touch Redis.
            assert skipped._value.get() - skipped_before >= 10 - 3

            await asyncio.to_thread(redis_server.restart)
            hit = False
            for _ in range(100):
                response = await client.retrieve(Q, top_k=3, budget_ms=BUDGET_MS)
                assert response.passages
                if response.cache_hit:
                    hit = True
                    break
                await asyncio.sleep(0.05)
            assert hit, "no cache hit after Redis came back"
        await cache.close()
        executor.shutdown()

    asyncio.run(body())


def test_query_replays_a_cached_answer_over_grpc(embedder, sample_index) -> None:
    async def body() -> None:
        executor = ThreadPoolExecutor(2)
        generator = FakeGenerator()
        answers = StoreBackedAnswerCache(MemoryStore())
        index = HnswIndex.load(sample_index)
        pipeline = assemble_pipeline(
            embedder, index, generator, executor, cache=StoreBackedCache(MemoryStore()), answers=answers
        )
        async with serve_pipeline(pipeline) as target, RagClient(target) as client:
            first = [e async for e in client.query(Q, top_k=3, budget_ms=BUDGET_MS)]
            await answers.drain()
            again = [e async for e in client.query(Q, top_k=3, budget_ms=BUDGET_MS)]
        executor.shutdown()
        assert generator.calls == 1
        assert [e.WhichOneof("event") for e in again] == [
            "retrieval",
            "token",
            "citation",
            "final",
        ]  # a replay cites too
        text = ["".join(e.token.text for e in events if e.HasField("token")) for events in (first, again)]
        assert text[0] == text[1] and text[0]
        miss, hit = first[-1].final, again[-1].final
        assert not miss.answer_cache_hit and hit.answer_cache_hit and hit.finish_reason == "stop"
        assert hit.usage == miss.usage and hit.usage.prompt_tokens == 100
        assert hit.timings.answer_cache_ms > 0 and 0 < hit.timings.ttft_ms <= hit.timings.total_ms
        assert again[0].retrieval.cache_hit
        assert [p.chunk_id for p in again[0].retrieval.passages] == [p.chunk_id for p in first[0].retrieval.passages]

    asyncio.run(body())
