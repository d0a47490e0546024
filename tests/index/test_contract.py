"""One retrieval contract, run against every index backend: hnswlib+bm25s folders and Qdrant.

Qdrant runs in qdrant-client's local mode (":memory:" and an on-disk path) here; the same code
talks to a server or cluster by URL.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from indexer.qdrant_publish import publish_folder_to_qdrant
from ragserve.embed.torch_backend import SentenceTransformerEmbedder
from ragserve.errors import IndexLoadError
from ragserve.index.base import SearchIndex
from ragserve.index.chunk_store import read_chunks
from ragserve.index.format import CHUNKS_FILE, VECTORS_FILE, read_verified_manifest, resolve_current
from ragserve.index.fusion import RetrievalOptions, effective_mode, hybrid_search, plan_breadth
from ragserve.index.hnsw import HnswIndex
from ragserve.index.qdrant_index import QdrantIndex, point_id


def publish_to_qdrant(client, name: str, root: Path) -> None:
    """The indexer's Qdrant publish, fed from the same published folder as the hnsw backend."""
    publish_folder_to_qdrant(client, name, root)


def _edge_available() -> bool:
    try:
        import qdrant_edge  # noqa: F401
    except ImportError:
        return False
    return True


# qdrant-path publishes the corpus to disk for every test (seconds each): left to the full run.
BACKENDS = ["hnsw", "qdrant-memory", pytest.param("qdrant-path", marks=pytest.mark.slow)]
# qdrant-edge-py is optional: the same contract runs on it wherever it installs.
BACKENDS += ["qdrant-edge"] if _edge_available() else []


@pytest.fixture(params=BACKENDS)
def index(request, sample_index: Path, tmp_path: Path) -> Iterator[SearchIndex]:
    if request.param == "hnsw":
        yield HnswIndex.load(sample_index)
        return
    if request.param == "qdrant-edge":
        from indexer.chunking import embedding_text
        from tests.index.qdrant_edge_index import EdgeIndex, build_edge_shard

        folder = resolve_current(sample_index)
        manifest = read_verified_manifest(folder)
        chunks = read_chunks(folder / CHUNKS_FILE)
        meta = {"version": manifest.version, "embedder_id": manifest.embedder_id, "dim": manifest.dim}
        shard = tmp_path / "edge"
        build_edge_shard(shard, chunks, np.load(folder / VECTORS_FILE), [embedding_text(c) for c in chunks], meta)
        edge = EdgeIndex.load(shard)
        yield edge
        edge.close()
        return
    from qdrant_client import QdrantClient

    client = QdrantClient(":memory:") if request.param == "qdrant-memory" else QdrantClient(path=str(tmp_path / "q"))
    publish_to_qdrant(client, "docs", sample_index)
    yield QdrantIndex.open(client, "docs")
    client.close()


def test_metadata(index: SearchIndex, embedder: SentenceTransformerEmbedder) -> None:
    assert index.embedder_id == embedder.model_id
    assert index.dim == embedder.dim
    assert index.count > 32
    assert index.version == "1"
    assert index.lexical_available


def test_dense_search(index: SearchIndex, embedder: SentenceTransformerEmbedder) -> None:
    vector = embedder.embed_queries(["How many bits per element does a Bloom filter need?"])[0]
    hits = index.search(vector, k=5, ef=64)
    assert len(hits) == 5
    assert hits[0].chunk.doc_id == "bloom-filters.txt"
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert hits[0].chunk.text and hits[0].chunk.end > hits[0].chunk.start


def test_lexical_search(index: SearchIndex) -> None:
    hits = index.search_lexical("bloom filter false positive rate", 5)
    assert hits and hits[0].chunk.doc_id == "bloom-filters.txt"
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert index.search_lexical("the of and", 5) == []  # stopwords only: no terms, no hits
    assert index.search_lexical("zzxxqqv", 5) == []


def test_chunks_by_id(index: SearchIndex, embedder: SentenceTransformerEmbedder) -> None:
    if type(index).__name__ == "EdgeIndex":
        pytest.skip("the qdrant-edge test backend has no lookup (warming only needs the served backends)")
    hits = index.search(embedder.embed_queries(["Bloom filter"])[0], k=3, ef=64)
    wanted = [hits[2].chunk.chunk_id, "no-such-chunk#0", hits[0].chunk.chunk_id]
    assert index.chunks_by_id(wanted) == [hits[2].chunk, hits[0].chunk]  # in the order asked, unknown ids skipped
    assert index.chunks_by_id([]) == []


def test_k_larger_than_the_index(index: SearchIndex, embedder: SentenceTransformerEmbedder) -> None:
    vector = embedder.embed_queries(["anything"])[0]
    assert len(index.search(vector, k=index.count + 10, ef=index.count + 10)) == index.count


@pytest.mark.parametrize("mode", ["dense", "bm25", "hybrid"])
def test_hybrid_search_dedupes_to_documents(
    index: SearchIndex, embedder: SentenceTransformerEmbedder, mode: str
) -> None:
    query = "Bloom filter false positive rate"
    vector = embedder.embed_queries([query])[0]
    for fusion in ("rrf", "weighted"):
        opts = RetrievalOptions(mode=mode, fusion=fusion)  # type: ignore[arg-type]
        ran = effective_mode(index, opts)
        assert ran == mode
        hits = hybrid_search(index, query, vector, plan_breadth(opts, ran, 10, 64, dedupe=True), opts, ran, dedupe=True)
        docs = [h.chunk.doc_id for h in hits]
        assert docs[0] == "bloom-filters.txt"
        assert len(docs) == len(set(docs))
        chunk_hits = hybrid_search(index, query, vector, plan_breadth(opts, ran, 10, 64, dedupe=False), opts, ran)
        assert len({h.chunk.doc_id for h in chunk_hits}) < len(chunk_hits)  # several chunks per document


def test_backends_agree(sample_index: Path, embedder: SentenceTransformerEmbedder) -> None:
    """Qdrant's BM25 (sparse vectors + IDF modifier) and bm25s rank the same documents first."""
    from qdrant_client import QdrantClient

    local = HnswIndex.load(sample_index)
    client = QdrantClient(":memory:")
    publish_to_qdrant(client, "docs", sample_index)
    remote = QdrantIndex.open(client, "docs")
    for query in ("TCP three-way handshake SYN ACK", "Little's law queue length", "Bloom filter hash functions"):
        a = [h.chunk.doc_id for h in local.search_lexical(query, 3)]
        b = [h.chunk.doc_id for h in remote.search_lexical(query, 3)]
        assert a[0] == b[0], (query, a, b)
        vector = embedder.embed_queries([query])[0]
        assert local.search(vector, 1, 64)[0].chunk.chunk_id == remote.search(vector, 1, 64)[0].chunk.chunk_id


def test_qdrant_publish_is_versioned_and_idempotent(sample_index: Path) -> None:
    from qdrant_client import QdrantClient

    client = QdrantClient(":memory:")
    publish_to_qdrant(client, "docs", sample_index)
    publish_to_qdrant(client, "docs", sample_index)
    publish_to_qdrant(client, "docs", sample_index)
    index = QdrantIndex.open(client, "docs")
    assert index.version == "3"
    names = sorted(c.name for c in client.get_collections().collections)
    assert names == ["docs_v000002", "docs_v000003"]  # the previous version is kept, older ones dropped
    first = index.search_lexical("Bloom filter", 1)[0].chunk
    assert client.retrieve("docs_v000003", [point_id(first.chunk_id)])[0].payload["chunk_id"] == first.chunk_id


def test_qdrant_missing_or_bad_collection_is_refused() -> None:
    from qdrant_client import QdrantClient, models

    client = QdrantClient(":memory:")
    with pytest.raises(IndexLoadError, match="no published Qdrant index"):
        QdrantIndex.open(client, "docs")
    client.create_collection("docs_v000001", vectors_config={"dense": models.VectorParams(size=4, distance="Cosine")})
    client.update_collection_aliases(
        change_aliases_operations=[
            models.CreateAliasOperation(
                create_alias=models.CreateAlias(collection_name="docs_v000001", alias_name="docs")
            )
        ]
    )
    with pytest.raises(IndexLoadError, match="metadata"):
        QdrantIndex.open(client, "docs")


@pytest.mark.slow  # runs the indexer CLI in a child process (loads MiniLM)
def test_indexer_cli_publishes_to_qdrant_and_server_factory_loads_it(tmp_path: Path) -> None:
    import subprocess
    import sys

    from ragserve.config import IndexSettings, QdrantSettings, Settings
    from ragserve.factory import make_index
    from tests.index.conftest import write_docs

    docs = write_docs(tmp_path / "docs")
    qdrant_path = tmp_path / "qdrant"
    cmd = [sys.executable, "-m", "indexer", "build", str(docs), "--out", str(tmp_path / "idx"), "--no-progress"]
    cmd += ["--qdrant-url", str(qdrant_path), "--qdrant-collection", "docs"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "published to Qdrant: alias 'docs' -> docs_v000001" in result.stdout
    index = make_index(
        Settings(index=IndexSettings(backend="qdrant"), qdrant=QdrantSettings(url=str(qdrant_path), collection="docs"))
    )
    assert isinstance(index, QdrantIndex)
    assert index.version == "1" and index.count == HnswIndex.load(tmp_path / "idx").count
    assert index.search_lexical("moon tides oceans", 1)[0].chunk.doc_id == "tides.txt"
