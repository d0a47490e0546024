"""The same retrieval contract on Qdrant (qdrant-client): a URL for a server or cluster, or local mode.

Layout: each index version is a collection `<name>_vNNNNNN` with a named dense vector ("dense",
cosine, HNSW) and a named sparse vector ("bm25", IDF modifier). BM25 runs inside Qdrant: each
chunk's sparse vector holds BM25's saturated term frequencies (k1, b, document length) and Qdrant
multiplies by IDF at query time, so scores are BM25's. The alias `<name>` points at the published
version and is flipped atomically once every point is written (upserts wait), which is Qdrant's
equivalent of the CURRENT symlink. Point ids are uuid5 of the chunk id: re-running an upsert
overwrites, never duplicates. qdrant_write.py writes a version; this module reads and serves it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import uuid
import zlib
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np

from ragserve.errors import IndexLoadError, Unavailable
from ragserve.filters import FieldSchema, Filter
from ragserve.index.base import ScoredChunk, SearchIndex
from ragserve.index.bm25 import bm25_terms
from ragserve.index.chunk_store import location_of
from ragserve.index.qdrant_filter import PAYLOAD_KEY, qdrant_filter
from ragserve.index.reload import ServedIndex, version_marker
from ragserve.types import Chunk

log = logging.getLogger(__name__)

DENSE = "dense"
SPARSE = "bm25"
BM25_K1 = 1.5
BM25_B = 0.75
_POINT_NAMESPACE = uuid.UUID("6f1c9a52-3b7e-4f0a-9d4e-1a2b3c4d5e6f")


@functools.cache
def _unreachable_errors() -> tuple[type[BaseException], ...]:
    # qdrant-client wraps transport failures in ResponseHandlingException and HTTP errors in
    # UnexpectedResponse (both ApiException); httpx and socket errors can still surface raw.
    import httpx
    from qdrant_client.http.exceptions import ApiException

    return (ApiException, httpx.HTTPError, OSError)


def point_id(chunk_id: str) -> str:
    """Deterministic: the same chunk always maps to the same point."""
    return str(uuid.uuid5(_POINT_NAMESPACE, chunk_id))


def term_index(term: str) -> int:
    # A stable hash (not Python's salted hash()), so the indexer and every server agree.
    return zlib.crc32(term.encode()) & 0x7FFFFFFF


def query_term_indices(query: str) -> list[int]:
    """The sparse-vector indices of a query's BM25 terms (each counted once: the IDF modifier and
    the stored document weights do the scoring)."""
    return sorted({term_index(t) for t in bm25_terms([query])[0]})


def version_collection(name: str, version: int) -> str:
    return f"{name}_v{version:06d}"


def make_client(url: str, api_key: str | None, timeout_s: int) -> Any:
    """`http(s)://...` is a server or cluster; `:memory:` or a folder path is qdrant-client's local mode.

    `timeout_s` bounds each HTTP call (connect and read), so a thread stuck on a silent server is freed.
    """
    from qdrant_client import QdrantClient

    if not url:
        raise IndexLoadError("RAGSERVE_QDRANT_URL is empty: give a Qdrant URL, ':memory:' or a local folder")
    if url == ":memory:":
        return QdrantClient(":memory:")
    if url.startswith(("http://", "https://")):
        return QdrantClient(url=url, api_key=api_key, prefer_grpc=False, timeout=timeout_s)
    return QdrantClient(path=url)


def _chunk_of(payload: dict[str, Any]) -> Chunk:
    return Chunk(
        chunk_id=payload["chunk_id"],
        doc_id=payload["doc_id"],
        text=payload["text"],
        title=payload.get("title", ""),
        source=payload.get("source", ""),
        start=int(payload.get("start", 0)),
        end=int(payload.get("end", 0)),
        metadata=dict(payload.get(PAYLOAD_KEY) or {}),
        location=location_of(payload.get("location")),
    )


def alias_target(client: Any, alias: str) -> str | None:
    for item in client.get_aliases().aliases:
        if item.alias_name == alias:
            return str(item.collection_name)
    return None


def published_identity(where: str, meta: dict[str, Any]) -> str:
    """The identity of a Qdrant-hosted version: where it lives and everything published with it,
    including `content_id` (the hash of the local manifest it was uploaded from, which lists every
    file's sha256). A collection published without one still differs by name, version and counts."""
    text = json.dumps([where, meta], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def published_marker(client: Any, name: str) -> str | None:
    """What the alias points to, with that collection's identity (so a collection deleted and
    published again under the same name is seen as new); None when nothing is published."""
    collection = alias_target(client, name)
    if collection is None:
        return None
    meta = dict(client.get_collection(collection).config.metadata or {})
    return version_marker(collection, published_identity(collection, meta))


class PublishedMeta:
    """What a Qdrant-backed index knows from the metadata the indexer published with its points."""

    _meta: dict[str, Any]
    _identity: str

    @property
    def identity(self) -> str:
        return self._identity

    @property
    def version(self) -> str:
        return str(self._meta["version"])

    @property
    def count(self) -> int:
        return int(self._meta["count"])

    @property
    def embedder_id(self) -> str:
        return str(self._meta["embedder_id"])

    @property
    def dim(self) -> int:
        return int(self._meta["dim"])

    @property
    def lexical_available(self) -> bool:
        return "bm25" in self._meta

    @property
    def fields(self) -> FieldSchema:
        return FieldSchema(self._meta.get("fields") or {})


class QdrantIndex(PublishedMeta):
    """A published Qdrant version (the collection the alias pointed to when loaded)."""

    def __init__(self, client: Any, collection: str, meta: dict[str, Any]) -> None:
        self._client = client
        self.collection = collection
        self._meta = meta
        self._identity = published_identity(collection, meta)

    @property
    def client(self) -> Any:
        """The connection this version was opened on; a reload reuses it (local mode allows one)."""
        return self._client

    @classmethod
    def connect(cls, url: str, name: str, api_key: str | None, timeout_s: int) -> QdrantIndex:
        return cls.open(make_client(url, api_key, timeout_s), name)

    @classmethod
    def open(cls, client: Any, name: str) -> QdrantIndex:
        collection = alias_target(client, name)
        if collection is None:
            raise IndexLoadError(f"no published Qdrant index {name!r} (no alias); run the indexer with --qdrant-url")
        meta = dict(client.get_collection(collection).config.metadata or {})
        for key in ("version", "embedder_id", "dim", "count"):
            if key not in meta:
                raise IndexLoadError(f"Qdrant collection {collection} has no {key!r} in its metadata")
        stored = client.count(collection, exact=True).count
        if stored != int(meta["count"]):
            raise IndexLoadError(f"Qdrant collection {collection} holds {stored} points, metadata says {meta['count']}")
        return cls(client, collection, meta)

    def _query(self, **query: Any) -> Any:
        return self._ask("query", lambda: self._client.query_points(self.collection, **query))

    @staticmethod
    def _ask(what: str, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except Exception as exc:
            if not isinstance(exc, _unreachable_errors()):
                raise
            # A down, unreachable or failing Qdrant is an unavailable dependency, not a bug here. Its
            # text can hold Qdrant's response body: the log gets it, the caller only the kind.
            log.warning("Qdrant %s failed: %s: %s", what, type(exc).__name__, exc)
            raise Unavailable(f"the Qdrant index is unavailable ({type(exc).__name__})") from exc

    @property
    def source(self) -> str:
        return self.collection

    def chunks_in_order(self, limit: int) -> Sequence[Chunk]:
        """The collection's points in Qdrant's own order (by point id), paged."""
        chunks: list[Chunk] = []
        offset: Any = None
        while len(chunks) < limit:
            page = functools.partial(self._client.scroll, self.collection, offset=offset, with_payload=True)
            points, offset = self._ask("scroll", functools.partial(page, limit=min(256, limit - len(chunks))))
            chunks += [_chunk_of(p.payload) for p in points if p.payload]
            if offset is None or not points:
                break
        return chunks

    def chunks_by_id(self, chunk_ids: Sequence[str], flt: Filter | None = None) -> list[Chunk]:
        from qdrant_client import models

        ids = [point_id(c) for c in chunk_ids]
        if not ids:
            return []
        if flt is None:
            points = self._ask("retrieve", lambda: self._client.retrieve(self.collection, ids=ids, with_payload=True))
        else:
            # Qdrant checks the filter on its payload index and returns only the points that pass:
            # one outside it is never sent, as one that does not exist.
            only = models.Filter(must=[models.HasIdCondition(has_id=ids), qdrant_filter(flt, self.fields)])
            points, _ = self._ask(
                "scroll",
                lambda: self._client.scroll(self.collection, scroll_filter=only, limit=len(ids), with_payload=True),
            )
        found = {chunk.chunk_id: chunk for chunk in (_chunk_of(p.payload) for p in points if p.payload)}
        return [found[c] for c in chunk_ids if c in found]

    def count_matching(self, flt: Filter | None) -> int:
        if flt is None:
            return self.count
        only = qdrant_filter(flt, self.fields)
        return int(self._ask("count", lambda: self._client.count(self.collection, count_filter=only, exact=True)).count)

    def search(self, query_vector: np.ndarray, k: int, ef: int, flt: Filter | None = None) -> list[ScoredChunk]:
        from qdrant_client import models

        k = min(k, self.count)
        if k <= 0:
            return []
        # Qdrant plans a filtered search itself (payload index, exact scan of few points, or a
        # filtered HNSW walk): its query planner is the counterpart of HnswIndex's choice.
        result = self._query(
            query=np.asarray(query_vector, dtype=np.float32).tolist(),
            using=DENSE,
            limit=k,
            query_filter=qdrant_filter(flt, self.fields),
            search_params=models.SearchParams(hnsw_ef=max(ef, k)),
            with_payload=True,
        )
        return [ScoredChunk(_chunk_of(p.payload), float(p.score)) for p in result.points]

    def search_lexical(self, query: str, k: int, flt: Filter | None = None) -> list[ScoredChunk]:
        from qdrant_client import models

        indices, k = query_term_indices(query), min(k, self.count)
        if k <= 0 or not indices:
            return []
        result = self._query(
            query=models.SparseVector(indices=indices, values=[1.0] * len(indices)),
            using=SPARSE,
            limit=k,
            query_filter=qdrant_filter(flt, self.fields),
            with_payload=True,
        )
        return [ScoredChunk(_chunk_of(p.payload), float(p.score)) for p in result.points if p.score > 0]


class QdrantWatch:
    """A Qdrant alias: the collection it points to is the published version."""

    def __init__(self, target: ServedIndex, name: str) -> None:
        # The serving version's own connection: local-mode Qdrant allows one client per folder.
        self._target = target
        self.name = name

    def _client(self) -> Any:
        return cast(QdrantIndex, self._target.index).client

    def published(self) -> str | None:
        return published_marker(self._client(), self.name)

    def load(self) -> QdrantIndex:
        return QdrantIndex.open(self._client(), self.name)

    def served(self, index: SearchIndex) -> str | None:
        return version_marker(index.source, index.identity)
