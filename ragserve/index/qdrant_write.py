"""Writing one version of an index into Qdrant: its points (a dense vector, a BM25 sparse vector and
the chunk as payload each), then the alias flipped to it once every point is written and counted.
The layout is qdrant_index.py's, which reads what this writes."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from ragserve.errors import IndexLoadError
from ragserve.index.bm25 import bm25_terms
from ragserve.index.qdrant_filter import create_payload_indexes
from ragserve.index.qdrant_index import (
    BM25_B,
    BM25_K1,
    DENSE,
    SPARSE,
    alias_target,
    point_id,
    term_index,
    version_collection,
)
from ragserve.types import Chunk


def sparse_bm25(terms: Sequence[str], avgdl: float) -> tuple[list[int], list[float]]:
    """A document's BM25 term weights without IDF (Qdrant's IDF modifier supplies it)."""
    counts = Counter(term_index(t) for t in terms)
    norm = BM25_K1 * (1.0 - BM25_B + BM25_B * len(terms) / max(avgdl, 1e-9))
    indices = sorted(counts)
    return indices, [counts[i] * (BM25_K1 + 1.0) / (counts[i] + norm) for i in indices]


def _chunk_payload(chunk: Chunk, row: int) -> dict[str, Any]:
    # The stored sentence analysis stays in folder versions; a Qdrant point's chunk is analysed
    # when a request first needs it.
    fields = {f.name: getattr(chunk, f.name) for f in dataclasses.fields(chunk) if f.name != "sentences"}
    location = chunk.location
    return {**fields, "location": None if location is None else location.record(), "row": row}


def point_batches(
    chunks: list[Chunk],
    vectors: np.ndarray,
    embedding_texts: list[str],
    batch: int,
    sparse_vector: Callable[..., Any],
) -> Iterator[list[tuple[str, dict[str, Any], dict[str, Any]]]]:
    """(point id, named vectors, payload) per chunk, in batches: a dense vector and, when the chunk has
    terms, a BM25 sparse vector (built by `sparse_vector(indices=, values=)`). Qdrant and
    qdrant-edge wrap them in their own point types."""
    terms = bm25_terms(embedding_texts)
    avgdl = float(np.mean([len(t) for t in terms])) if terms else 1.0
    for start in range(0, len(chunks), batch):
        parts = []
        for row in range(start, min(start + batch, len(chunks))):
            idx, vals = sparse_bm25(terms[row], avgdl)
            vec: dict[str, Any] = {DENSE: vectors[row].tolist()}
            if idx:
                vec[SPARSE] = sparse_vector(indices=idx, values=vals)
            parts.append((point_id(chunks[row].chunk_id), vec, _chunk_payload(chunks[row], row)))
        yield parts


def publish_collection(
    client: Any,
    name: str,
    chunks: list[Chunk],
    vectors: np.ndarray,
    embedding_texts: list[str],
    meta: dict[str, Any],
    hnsw_m: int = 32,
    ef_construct: int = 200,
    batch: int = 256,
) -> tuple[str, int]:
    """Write a new version collection, verify its count, flip the alias; returns (collection, version)."""
    from qdrant_client import models

    current = alias_target(client, name)
    version = 1
    if current is not None:
        version = int((client.get_collection(current).config.metadata or {}).get("version", 0)) + 1
    target = version_collection(name, version)
    # A killed earlier build may have left an unpublished collection: never reuse it half-filled.
    if client.collection_exists(target):
        client.delete_collection(target)
    full_meta = {**meta, "version": version, "count": len(chunks), "bm25": {"k1": BM25_K1, "b": BM25_B}}
    client.create_collection(
        target,
        vectors_config={DENSE: models.VectorParams(size=int(vectors.shape[1]), distance=models.Distance.COSINE)},
        sparse_vectors_config={SPARSE: models.SparseVectorParams(modifier=models.Modifier.IDF)},
        hnsw_config=models.HnswConfigDiff(m=hnsw_m, ef_construct=ef_construct),
        metadata=full_meta,
    )
    create_payload_indexes(client, target, meta.get("fields") or {})
    for parts in point_batches(chunks, vectors, embedding_texts, batch, models.SparseVector):
        points = [models.PointStruct(id=pid, vector=vec, payload=payload) for pid, vec, payload in parts]
        client.upsert(target, points=points, wait=True)
    stored = client.count(target, exact=True).count
    if stored != len(chunks):
        raise IndexLoadError(f"Qdrant collection {target} holds {stored} points after upload, expected {len(chunks)}")
    ops: list[Any] = []
    if current is not None:
        ops.append(models.DeleteAliasOperation(delete_alias=models.DeleteAlias(alias_name=name)))
    ops.append(models.CreateAliasOperation(create_alias=models.CreateAlias(collection_name=target, alias_name=name)))
    client.update_collection_aliases(change_aliases_operations=ops)  # one atomic switch
    # Keep the previous version (servers may still be reading it); drop anything older.
    for coll in client.get_collections().collections:
        cname = str(coll.name)
        if cname.startswith(f"{name}_v") and cname not in (target, current):
            client.delete_collection(cname)
    return target, version
