"""The cache inside the request path, with the real MiniLM embedder and a real HNSW index."""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from pydantic import SecretStr

from indexer.build import build_index
from ragserve.budget import Deadline, RequestContext
from ragserve.cache.base import CachedRetrieval, CacheHit
from ragserve.cache.keys import RetrievalKey
from ragserve.cache.layer import StoreBackedCache
from ragserve.cache.memory import MemoryStore
from ragserve.cache.semantic import SemanticIndex
from ragserve.config import CacheSettings
from ragserve.factory import assemble_pipeline, make_cache
from ragserve.index.hnsw import HnswIndex
from ragserve.metrics import CACHE_REQUESTS
from ragserve.request.pipeline import RagPipeline
from ragserve.types import RetrievalResult, RetrieveParams
from tests.conftest import SAMPLE_DOCS

Q = "What does the TCP three-way handshake exchange between client and server?"


@pytest.fixture
def executor():
    pool = ThreadPoolExecutor(2)
    yield pool
    pool.shutdown()


def _pipeline(embedder, index_root: Path, executor, cache) -> RagPipeline:
    return assemble_pipeline(embedder, HnswIndex.load(index_root), None, executor, cache=cache)


async def _retrieve(pipeline: RagPipeline, query: str, top_k: int = 3, budget_ms: int = 10_000) -> RetrievalResult:
    result = await pipeline.retrieve(RetrieveParams(query, top_k, budget_ms), RequestContext(Deadline(budget_ms)))
    if pipeline.caches.passages is not None:
        await pipeline.caches.passages.drain()  # type: ignore[attr-defined]
    return result


def test_second_request_is_a_hit_with_the_same_passages(embedder, sample_index, executor) -> None:
    cache = StoreBackedCache(MemoryStore())
    pipeline = _pipeline(embedder, sample_index, executor, cache)
    hits = CACHE_REQUESTS.labels("memory", "hit")

    async def body() -> tuple[RetrievalResult, RetrievalResult, RetrievalResult]:
        first = await _retrieve(pipeline, Q)
        before = hits._value.get()
        second = await _retrieve(pipeline, f"  {Q.replace(' ', '  ')}\n")
        assert hits._value.get() == before + 1
        other_k = await _retrieve(pipeline, Q, top_k=2)
        return first, second, other_k

    first, second, other_k = asyncio.run(body())
    assert not first.cache_hit and first.timings.embed_ms > 0
    assert second.cache_hit
    assert second.timings.embed_ms == 0 and second.timings.search_ms == 0  # both skipped
    assert second.timings.cache_ms > 0 and second.timings.retrieval_total_ms >= second.timings.cache_ms
    assert [(p.chunk, p.score, p.rank) for p in second.passages] == [(p.chunk, p.score, p.rank) for p in first.passages]
    assert second.index_version == first.index_version
    assert second.passages[0].chunk.doc_id == "tcp-three-way-handshake.md"
    assert not other_k.cache_hit and len(other_k.passages) == 2


def test_degraded_results_are_not_cached(embedder, sample_index, executor) -> None:
    cache = StoreBackedCache(MemoryStore())
    pipeline = _pipeline(embedder, sample_index, executor, cache)

    async def body() -> tuple[RetrievalResult, RetrievalResult]:
        cut = await _retrieve(pipeline, Q, budget_ms=0)  # the budget is gone before search
        again = await _retrieve(pipeline, Q)
        return cut, again

    cut, again = asyncio.run(body())
    assert cut.degraded.is_degraded()
    assert not again.cache_hit  # the cut-short result was not stored
    assert len(cache.store) == 1  # type: ignore[arg-type]  # ... but the full one was


def test_degraded_results_can_be_kept_briefly_and_say_so(embedder, sample_index, executor) -> None:
    store = MemoryStore()
    cache = StoreBackedCache(store, ttl_s=3600, degraded_ttl_s=30)
    pipeline = _pipeline(embedder, sample_index, executor, cache)

    async def body() -> tuple[RetrievalResult, RetrievalResult]:
        return await _retrieve(pipeline, Q, budget_ms=0), await _retrieve(pipeline, Q)

    cut, again = asyncio.run(body())
    assert cut.degraded.is_degraded() and not cut.cache_hit
    assert again.cache_hit and again.passages == cut.passages
    assert any("cut short" in n for n in again.degraded.notes)
    expires_at, _ = store._data[next(iter(store._data))]
    assert expires_at - time.monotonic() <= 30


def test_new_index_version_makes_old_entries_unreachable(embedder, sample_index, executor, tmp_path) -> None:
    root = tmp_path / "index"
    shutil.copytree(sample_index, root, symlinks=True)
    cache = StoreBackedCache(MemoryStore())
    pipeline = _pipeline(embedder, root, executor, cache)

    async def before() -> tuple[RetrievalResult, RetrievalResult]:
        return await _retrieve(pipeline, Q), await _retrieve(pipeline, Q)

    v1_miss, v1_hit = asyncio.run(before())
    assert not v1_miss.cache_hit and v1_hit.cache_hit

    docs = tmp_path / "docs"
    shutil.copytree(SAMPLE_DOCS, docs)
    (docs / "new-doc.md").write_text("# A new document\n\nPublished after the first index version.\n")
    report = build_index(docs, root, embedder, progress=False)
    assert report.published and str(report.version) != v1_hit.index_version
    pipeline.swap_index(HnswIndex.load(root))  # what a reload does

    async def after() -> tuple[RetrievalResult, RetrievalResult]:
        return await _retrieve(pipeline, Q), await _retrieve(pipeline, Q)

    v2_first, v2_second = asyncio.run(after())
    assert not v2_first.cache_hit and v2_first.index_version == str(report.version)
    assert v2_second.cache_hit and v2_second.index_version == str(report.version)


class FakeExplodingCache:
    """A cache implementation that breaks its own contract and raises: the request must not care."""

    backend = "fake"
    semantic_enabled = True

    async def get(self, key: RetrievalKey, timeout_s: float | None = None) -> CacheHit | None:
        raise RuntimeError("boom")

    async def get_similar(
        self, key: RetrievalKey, query_vector: np.ndarray, timeout_s: float | None = None
    ) -> CacheHit | None:
        raise RuntimeError("boom")

    def put(self, key: RetrievalKey, entry: CachedRetrieval, query_vector: np.ndarray | None = None) -> None:
        raise RuntimeError("boom")

    async def start(self) -> None: ...

    async def flush(self) -> int:
        return 0

    async def close(self) -> None: ...

    async def drain(self) -> None: ...


def test_a_raising_cache_never_fails_the_request(embedder, sample_index, executor) -> None:
    pipeline = _pipeline(embedder, sample_index, executor, FakeExplodingCache())
    result = asyncio.run(_retrieve(pipeline, Q))
    assert not result.cache_hit and result.passages[0].chunk.doc_id == "tcp-three-way-handshake.md"


def test_semantic_hit_through_the_pipeline(embedder, sample_index, executor) -> None:
    cache = StoreBackedCache(MemoryStore(), semantic=SemanticIndex(threshold=0.95))
    pipeline = _pipeline(embedder, sample_index, executor, cache)

    async def body() -> list[RetrievalResult]:
        return [
            await _retrieve(pipeline, "What is the role of evaporation in the water cycle?"),
            await _retrieve(pipeline, "What's the role of evaporation in the water cycle?"),
            await _retrieve(pipeline, "What is not the role of evaporation in the water cycle?"),
        ]

    stored, paraphrase, negated = asyncio.run(body())
    assert not stored.cache_hit
    assert paraphrase.cache_hit and paraphrase.timings.embed_ms > 0 and paraphrase.timings.search_ms == 0
    assert paraphrase.passages == stored.passages
    assert any("near-duplicate" in n for n in paraphrase.degraded.notes)
    # The earlier caller's question is never told to this one.
    assert not any("role of evaporation" in n for n in paraphrase.degraded.notes)
    assert not negated.cache_hit


def test_factory_builds_each_backend() -> None:
    assert make_cache(CacheSettings(backend="off")) is None
    memory = make_cache(CacheSettings(backend="memory", semantic=True))
    assert memory is not None and memory.backend == "memory" and memory.semantic_enabled
    redis = make_cache(CacheSettings(backend="redis", redis_url="redis://127.0.0.1:1/0", allow_unsigned=True))
    assert redis is not None and redis.backend == "redis" and not redis.semantic_enabled
    asyncio.run(redis.close())


def test_a_redis_cache_without_a_key_is_refused_unless_unsigned_entries_are_allowed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from ragserve.errors import ConfigError
    from ragserve.factory import make_answer_cache

    unsigned = CacheSettings(backend="redis", redis_url="redis://127.0.0.1:1/0")
    for build in (make_cache, make_answer_cache):
        with pytest.raises(ConfigError, match=r"RAGSERVE_CACHE_HMAC_KEY_FILE.*RAGSERVE_CACHE_ALLOW_UNSIGNED"):
            build(unsigned)
    signed = make_cache(unsigned.model_copy(update={"hmac_key": SecretStr("k" * 32)}))
    assert signed is not None
    asyncio.run(signed.close())
    with caplog.at_level(logging.WARNING, logger="ragserve.factory"):
        allowed = make_cache(unsigned.model_copy(update={"allow_unsigned": True}))
    assert allowed is not None and "not signed" in caplog.text
    asyncio.run(allowed.close())
