"""The same retrieval contract on qdrant-edge (Qdrant's engine in-process, one shard on local disk).

Kept with the tests, not in the product: the factory does not offer it as a backend. The contract
tests run on it to show the SearchIndex Protocol holds on Qdrant's own engine, not only over HTTP.

Same data model as the Qdrant backend (named dense vector + BM25 sparse vector with the IDF
modifier, uuid5 point ids, chunk payloads), without a server: for a single host that wants
Qdrant's engine. The shard folder holds `ragserve_meta.json` (version, embedder, counts) beside
the shard's own files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ragserve.errors import IndexLoadError
from ragserve.filters import Filter
from ragserve.index.base import ScoredChunk
from ragserve.index.qdrant_index import (
    BM25_B,
    BM25_K1,
    DENSE,
    SPARSE,
    PublishedMeta,
    _chunk_of,
    published_identity,
    query_term_indices,
)
from ragserve.index.qdrant_write import point_batches
from ragserve.types import Chunk

META_FILE = "ragserve_meta.json"


def _unfiltered(flt: Filter | None) -> None:
    # This test-only backend shows the unfiltered contract on Qdrant's engine; filters are shown on
    # the Qdrant backend itself (qdrant-client), whose translation the product ships.
    if flt is not None:
        raise NotImplementedError("the qdrant-edge test index takes no filter")


def build_edge_shard(
    path: Path,
    chunks: list[Chunk],
    vectors: np.ndarray,
    embedding_texts: list[str],
    meta: dict[str, Any],
    batch: int = 256,
) -> None:
    import qdrant_edge as qe

    config = qe.EdgeConfig(
        vectors={DENSE: qe.EdgeVectorParams(size=int(vectors.shape[1]), distance=qe.Distance.Cosine)},
        sparse_vectors={SPARSE: qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)},
    )
    shard = qe.EdgeShard.create(str(path), config)
    try:
        for parts in point_batches(chunks, vectors, embedding_texts, batch, qe.SparseVector):
            points = [qe.Point(id=pid, vector=vec, payload=payload) for pid, vec, payload in parts]
            shard.update(qe.UpdateOperation.upsert_points(points))
        shard.flush()
    finally:
        shard.close()
    full = {**meta, "count": len(chunks), "bm25": {"k1": BM25_K1, "b": BM25_B}}
    (path / META_FILE).write_text(json.dumps(full))


class EdgeIndex(PublishedMeta):
    def __init__(self, shard: Any, meta: dict[str, Any]) -> None:
        self._shard = shard
        self._meta = meta
        self._identity = published_identity("qdrant-edge", meta)

    @classmethod
    def load(cls, path: Path) -> EdgeIndex:
        import qdrant_edge as qe

        try:
            meta = json.loads((path / META_FILE).read_text())
            shard = qe.EdgeShard.load(str(path))
        except (OSError, ValueError) as exc:
            raise IndexLoadError(f"qdrant-edge shard at {path} cannot be loaded: {exc}") from exc
        stored = shard.count(qe.CountRequest(exact=True))
        if stored != int(meta["count"]):
            raise IndexLoadError(f"qdrant-edge shard at {path} holds {stored} points, metadata says {meta['count']}")
        return cls(shard, meta)

    def close(self) -> None:
        self._shard.close()

    def count_matching(self, flt: Filter | None) -> int:
        _unfiltered(flt)
        return self.count

    def search(self, query_vector: np.ndarray, k: int, ef: int, flt: Filter | None = None) -> list[ScoredChunk]:
        import qdrant_edge as qe

        _unfiltered(flt)
        k = min(k, self.count)
        if k <= 0:
            return []
        vector = np.asarray(query_vector, dtype=np.float32).tolist()
        request = qe.QueryRequest(
            limit=k,
            query=qe.Query.Nearest(vector, using=DENSE),
            with_payload=True,
            params=qe.SearchParams(hnsw_ef=max(ef, k)),
        )
        return [ScoredChunk(_chunk_of(p.payload), float(p.score)) for p in self._shard.query(request)]

    def search_lexical(self, query: str, k: int, flt: Filter | None = None) -> list[ScoredChunk]:
        import qdrant_edge as qe

        _unfiltered(flt)
        indices, k = query_term_indices(query), min(k, self.count)
        if k <= 0 or not indices:
            return []
        sparse = qe.SparseVector(indices=indices, values=[1.0] * len(indices))
        request = qe.QueryRequest(limit=k, query=qe.Query.Nearest(sparse, using=SPARSE), with_payload=True)
        return [ScoredChunk(_chunk_of(p.payload), float(p.score)) for p in self._shard.query(request) if p.score > 0]
