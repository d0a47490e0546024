"""Caches key on what an index version holds, not on its number: two corpora published as v1, a root
rebuilt from scratch, or hnsw and Qdrant at the same number never share entries; a rebuilt root
that restarts at v1 is reloaded."""

from __future__ import annotations

import asyncio
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ragserve.budget import Deadline, RequestContext
from ragserve.cache.layer import StoreBackedAnswerCache, StoreBackedCache
from ragserve.cache.memory import MemoryStore
from ragserve.config import IndexSettings, QdrantSettings, Settings
from ragserve.factory import assemble_pipeline, make_index_watch
from ragserve.index.hnsw import HnswIndex
from ragserve.index.reload import IndexReloader
from ragserve.request.pipeline import RagPipeline
from ragserve.types import GenerateParams, RetrievalResult, RetrieveParams
from tests.fakes import FakeEmbedder, FakeGeneratorBase, FakeServing
from tests.index.tiny import DIM, publish_tiny

CORPUS_A = [f"alpha passage {i} on rivers" for i in range(40)]
CORPUS_B = [f"bravo passage {i} on mountains" for i in range(40)]
Q = "which passage talks about water?"


@pytest.fixture
def executor():
    pool = ThreadPoolExecutor(2)
    yield pool
    pool.shutdown()


def _pipeline(index: HnswIndex, executor: ThreadPoolExecutor) -> RagPipeline:
    return assemble_pipeline(
        FakeEmbedder(DIM),
        index,
        FakeGeneratorBase(),
        executor,
        cache=StoreBackedCache(MemoryStore()),
        answers=StoreBackedAnswerCache(MemoryStore()),
    )


async def _retrieve(pipeline: RagPipeline) -> RetrievalResult:
    result = await pipeline.retrieve(RetrieveParams(Q, 3, 10_000), RequestContext(Deadline(10_000)))
    await pipeline.caches.passages.drain()  # type: ignore[union-attr]
    return result


def _texts(result: RetrievalResult) -> set[str]:
    return {p.chunk.text for p in result.passages}


def test_two_corpora_published_as_v1_do_not_share_cache_entries(tmp_path: Path, executor) -> None:
    index_a = HnswIndex.load(publish_tiny(tmp_path / "a", CORPUS_A, seed=1).parent)
    index_b = HnswIndex.load(publish_tiny(tmp_path / "b", CORPUS_B, seed=1).parent)
    assert index_a.version == index_b.version == "1"
    pipeline = _pipeline(index_a, executor)

    first_a = asyncio.run(_retrieve(pipeline))
    assert asyncio.run(_retrieve(pipeline)).cache_hit  # the cache works for one corpus
    pipeline.swap_index(index_b)  # another corpus on the same cache, at the same version number
    first_b = asyncio.run(_retrieve(pipeline))
    assert not first_b.cache_hit
    assert _texts(first_b) <= set(CORPUS_B) and _texts(first_a) <= set(CORPUS_A)
    # Answers are keyed on the retrieval they came from: the two corpora's answers are apart too.
    gen = GenerateParams(max_tokens=16, temperature=0.0)
    params = RetrieveParams(Q, 3, 10_000)
    caches = pipeline.caches
    answer_a, answer_b = (
        caches.answer_key(caches.key_for(params, r.index_version, r.index_identity), gen) for r in (first_a, first_b)
    )
    assert answer_a is not None and answer_b is not None
    assert answer_a.storage_key != answer_b.storage_key
    assert index_a.identity != index_b.identity


def test_root_rebuilt_from_scratch_at_v1_is_reloaded_and_misses_the_old_cache(tmp_path: Path, executor) -> None:
    root = tmp_path / "idx"
    publish_tiny(root, CORPUS_A)
    pipeline = _pipeline(HnswIndex.load(root), executor)
    reloader = IndexReloader(make_index_watch(Settings(index=IndexSettings(path=root)), pipeline), pipeline)
    assert reloader.check_once() is False  # nothing new yet
    asyncio.run(_retrieve(pipeline))
    assert asyncio.run(_retrieve(pipeline)).cache_hit

    shutil.rmtree(root)  # rebuilt from nothing: numbering restarts at v1
    publish_tiny(root, CORPUS_B)
    assert reloader.check_once() is True
    assert pipeline.index.version == "1" and _texts(asyncio.run(_retrieve(pipeline))) <= set(CORPUS_B)
    assert reloader.check_once() is False  # and it is reloaded once, not on every check


def test_qdrant_identity_names_the_content_not_the_number(tmp_path: Path) -> None:
    from qdrant_client import QdrantClient

    from indexer.qdrant_publish import publish_folder_to_qdrant
    from ragserve.index.qdrant_index import QdrantIndex

    root_a, root_b = tmp_path / "a", tmp_path / "b"
    publish_tiny(root_a, CORPUS_A)
    publish_tiny(root_b, CORPUS_B)
    client_a, client_b = QdrantClient(":memory:"), QdrantClient(":memory:")
    publish_folder_to_qdrant(client_a, "docs", root_a)
    publish_folder_to_qdrant(client_b, "docs", root_b)
    on_a, on_b = QdrantIndex.open(client_a, "docs"), QdrantIndex.open(client_b, "docs")
    assert on_a.collection == on_b.collection and on_a.version == on_b.version == "1"

    # A Qdrant store wiped and published again from v1 with other content is a new version.
    holder = FakeServing(on_a)
    settings = Settings(index=IndexSettings(backend="qdrant"), qdrant=QdrantSettings(url=":memory:", collection="docs"))
    watch = make_index_watch(settings, holder)
    reloader = IndexReloader(watch, holder)
    assert reloader.check_once() is False
    client_a.delete_collection(on_a.collection)  # the alias goes with it
    publish_folder_to_qdrant(client_a, "docs", root_b)
    assert reloader.check_once() is True
    assert holder.index.version == "1" and holder.index.identity not in (on_a.identity, "")

    assert on_a.identity != on_b.identity  # same name and number, other content
    # Qdrant and hnsw serving the same local version rank differently: never one cache entry.
    assert on_a.identity != HnswIndex.load(root_a).identity
    client_a.close()
    client_b.close()
