"""hnswlib dense index plus an in-memory docstore, loaded from a verified index folder (building
the graph and measuring its breadth: hnsw_build.py)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import hnswlib
import numpy as np

from ragserve.digests import forget_cached
from ragserve.errors import IndexLoadError
from ragserve.filters import FieldSchema, Filter
from ragserve.index.base import ScoredChunk
from ragserve.index.bm25 import BM25_DIR, Bm25Index
from ragserve.index.chunk_rows import ChunkRows
from ragserve.index.chunk_store import ChunkStore, Prefix
from ragserve.index.format import (
    CHUNKS_FILE,
    HNSW_FILE,
    MANIFEST,
    VECTORS_FILE,
    Manifest,
    read_verified_version,
    require_listed,
    resolve_current,
)
from ragserve.index.graph import Graph, GraphFile, LoadedGraph, open_in_process
from ragserve.index.metadata import FIELDS_FILE, FieldColumns
from ragserve.types import Chunk

log = logging.getLogger(__name__)

# A filtered search scans the passing chunks' vectors exactly, or asks the graph for enough
# neighbours that k of them pass and keeps those, whichever costs less. A scan costs some 0.27 us a
# passing vector; the graph some 5.5 us per unit of the breadth it needs, max(ef, 2k) / selectivity
# (measured on SciFact, BENCHMARKS.md "Filters"). So scan when n^2 <= 20 * max(ef, 2k) * count for
# n passing chunks, and never more than the setting's cap of vectors.
DEFAULT_EXACT_SCAN_MAX = 20_000
_WALK_OVER_SCAN_COST = 20
_EXACT_SLAB = 65536  # vectors scored at a time by a filtered search's exact scan
# The widest a filtered HNSW search may look, as a multiple of its unfiltered ef.
_FILTERED_EF_GROWTH_MAX = 16


class _Laps:
    """Seconds per step of a load, for its log line (a reload's cost at a glance)."""

    def __init__(self) -> None:
        self._last = self._start = time.perf_counter()
        self._laps: list[str] = []

    def __call__(self, step: str) -> None:
        now = time.perf_counter()
        self._laps.append(f"{step} {now - self._last:.2f} s")
        self._last = now

    def __str__(self) -> str:
        return f"{time.perf_counter() - self._start:.2f} s ({', '.join(self._laps)})"


# Opens a version's graph file: in this process or a helper (the factory picks), after
# `check_hnsw_file` there.
GraphOpener = Callable[[GraphFile], Graph]


def _require_bm25_listed(folder: Path, manifest: Manifest) -> None:
    """bm25s reads whatever is in the folder: every file there must be listed (and so verified)."""
    present = sorted(p.relative_to(folder).as_posix() for p in (folder / BM25_DIR).rglob("*") if not p.is_dir())
    unlisted = [name for name in present if name not in manifest.files]
    if not present or unlisted:
        what = f"{unlisted[0]} is not listed in its {MANIFEST}" if unlisted else f"{BM25_DIR}/ is empty"
        raise IndexLoadError(f"index at {folder}: {what}")


def _graph_file(folder: Path, manifest: Manifest, identity: str, reloading: bool) -> GraphFile:
    base = manifest.graph_base
    vectors = folder / VECTORS_FILE if VECTORS_FILE in manifest.files else None
    extends = (str(base["identity"]), int(base["rows"])) if base else None
    return GraphFile(folder / HNSW_FILE, manifest.dim, manifest.count, reloading, identity, extends, vectors)


class HnswIndex:
    """A loaded index version's index files (graph, docstore, BM25). Read-only and safe to search
    from several threads. Models a version ships are loaded by the factory (`VersionBuilder`)."""

    def __init__(
        self,
        folder: Path,
        manifest: Manifest,
        identity: str,
        graph: Graph | hnswlib.Index,
        chunks: Sequence[Chunk],
        bm25: Bm25Index | None = None,
        vectors: np.ndarray | None = None,
        exact_scan_max: int = DEFAULT_EXACT_SCAN_MAX,
        columns: FieldColumns | None = None,
    ) -> None:
        """`graph`: an hnswlib index is searched in this process. `vectors`: the version's vectors
        (memory-mapped), row i = chunk i, for exact filtered scans; None (a version without
        vectors.npy): the graph hands them out instead."""
        self.folder = folder
        self.manifest = manifest
        self._graph: Graph = LoadedGraph(graph) if isinstance(graph, hnswlib.Index) else graph
        self._chunks = chunks
        self._bm25 = bm25
        self._identity = identity
        self._chunk_rows = ChunkRows(folder, manifest, chunks)  # built on first use (warming, fetch)
        self._fields = FieldSchema(manifest.fields)
        # The indexer's stored columns, else every chunk decoded (a version built before them).
        self._columns = columns if columns is not None else FieldColumns(chunks, self._fields)
        self._vectors = vectors
        self.exact_scan_max = exact_scan_max

    @classmethod
    def load(
        cls,
        root: Path,
        exact_scan_max: int = DEFAULT_EXACT_SCAN_MAX,
        open_graph: GraphOpener = open_in_process,
        reloading: bool = False,
    ) -> HnswIndex:
        """The published version's index files, verified. `exact_scan_max`: filters passing at most
        this many chunks are searched by an exact scan (RAGSERVE_FILTER_EXACT_SCAN_MAX_CHUNKS).
        `reloading`: requests are being served meanwhile, so checksums are computed, and a helper
        process loads the graph, at a lower CPU priority."""
        laps = _Laps()
        folder = resolve_current(root)
        manifest, identity = read_verified_version(folder, yield_cpu=reloading)
        laps("checksums")
        require_listed(folder, manifest, HNSW_FILE, CHUNKS_FILE)
        if manifest.bm25:
            _require_bm25_listed(folder, manifest)
        chunks = ChunkStore(folder / CHUNKS_FILE, manifest.count)
        laps("docstore")
        # The opener checks the file before hnswlib reads it (graph.py `load_graph`).
        graph = open_graph(_graph_file(folder, manifest, identity, reloading))
        laps(f"graph checked and loaded ({type(graph).__name__})")
        try:
            return cls._around(folder, manifest, identity, graph, chunks, exact_scan_max, laps)
        except BaseException:
            # Now, not when collected: a helper's restart loads the files of the versions still open.
            graph.close()
            raise

    @classmethod
    def _around(
        cls,
        folder: Path,
        manifest: Manifest,
        identity: str,
        graph: Graph,
        chunks: ChunkStore,
        exact_scan_max: int,
        laps: _Laps,
    ) -> HnswIndex:
        """The version around its opened graph: the rest of its files, checked."""
        if graph.count != manifest.count:
            raise IndexLoadError(f"index at {folder}: HNSW holds {graph.count} vectors, manifest says {manifest.count}")
        bm25 = Bm25Index.load(folder, manifest.count) if manifest.bm25 else None
        # The graph and BM25's arrays now live in memory (here or in a helper): their files' pages
        # only crowd the page cache, which a reload fills with a second version besides.
        forget_cached([folder / HNSW_FILE, *(folder / name for name in manifest.files if name.startswith(BM25_DIR))])
        vectors = None
        if VECTORS_FILE in manifest.files:  # verified with the rest; mapped, not read, until a filter needs it
            vectors = np.load(folder / VECTORS_FILE, mmap_mode="r", allow_pickle=False)
            if vectors.shape != (manifest.count, manifest.dim):
                raise IndexLoadError(f"index at {folder}: {VECTORS_FILE} has shape {vectors.shape}")
        columns = None
        if FIELDS_FILE in manifest.files:
            columns = FieldColumns.read(folder / FIELDS_FILE, manifest.count, manifest.fields)
        laps("bm25, vectors and columns")
        log.info("index version %s (%d chunks) read in %s", manifest.version, manifest.count, laps)
        return cls(folder, manifest, identity, graph, chunks, bm25, vectors, exact_scan_max, columns)

    @property
    def chunks(self) -> Sequence[Chunk]:
        """Row i of the version (the docstore, decoded row by row)."""
        return self._chunks

    def chunks_in_order(self, limit: int) -> Sequence[Chunk]:
        return Prefix(self._chunks, limit)

    def chunks_by_id(self, chunk_ids: Sequence[str], flt: Filter | None = None) -> list[Chunk]:
        found = self._read_by_id(chunk_ids, flt)
        if any(chunk.chunk_id != wanted for wanted, chunk in found):
            self._chunk_rows.decode_instead()  # records that do not hold: the chunks' own ids
            found = self._read_by_id(chunk_ids, flt)
        return [chunk for _, chunk in found]

    def _read_by_id(self, chunk_ids: Sequence[str], flt: Filter | None) -> list[tuple[str, Chunk]]:
        """The rows are checked against `flt`'s mask before any chunk is read: an id outside it
        costs what an unknown one costs (a lookup; nothing read or decoded), so the two look alike."""
        if not chunk_ids or self.count == 0:
            return []
        rows = self._chunk_rows.of(chunk_ids)
        if flt is not None:
            rows = np.where((rows >= 0) & self._columns.mask(flt)[np.maximum(rows, 0)], rows, -1)
        return [(c, self._chunks[int(row)]) for c, row in zip(chunk_ids, rows, strict=True) if row >= 0]

    @property
    def version(self) -> str:
        return str(self.manifest.version)

    @property
    def source(self) -> str:
        return self.folder.name

    @property
    def identity(self) -> str:
        return self._identity

    @property
    def count(self) -> int:
        return self.manifest.count

    @property
    def embedder_id(self) -> str:
        return self.manifest.embedder_id

    @property
    def dim(self) -> int:
        return self.manifest.dim

    @property
    def fields(self) -> FieldSchema:
        return self._fields

    def count_matching(self, flt: Filter | None) -> int:
        return self.count if flt is None else int(np.count_nonzero(self._columns.mask(flt)))

    def search(self, query_vector: np.ndarray, k: int, ef: int, flt: Filter | None = None) -> list[ScoredChunk]:
        k = min(k, self.count)
        if k <= 0:
            return []
        if flt is None:
            return self._scored(*self._knn(query_vector, k, max(ef, k)))
        mask = self._columns.mask(flt)
        allowed, ef = int(np.count_nonzero(mask)), max(ef, k)
        if allowed <= self.exact_scan_max and allowed * allowed <= _WALK_OVER_SCAN_COST * max(ef, 2 * k) * self.count:
            return self._scan(query_vector, k, np.flatnonzero(mask))
        # The walk looks about 1 / selectivity times as far to find as many that pass. It asks the
        # graph for that many neighbours and keeps those that pass: no Python call per visited node,
        # which on a server's threads waits for the GIL at every visit (BENCHMARKS.md, "Filters").
        widened = min(int(ef * self.count / allowed) + 1, ef * _FILTERED_EF_GROWTH_MAX, self.count)
        wanted = min(2 * int(k * self.count / allowed) + 10, self.count)  # twice what k passing needs
        labels, distances = self._knn(query_vector, wanted, max(widened, wanted))
        passing = mask[labels]
        if int(np.count_nonzero(passing)) >= min(k, allowed):
            return self._scored(labels[passing][:k], distances[passing][:k])
        # Too few passed (a filter that keeps far from the question): the exact scan, slab by slab.
        # Not the graph walked with the filter: hnswlib then calls back into Python at every node
        # it visits, under the graph's lock, for as long as it takes (about a second at a million).
        return self._scan(query_vector, k, np.flatnonzero(mask))

    def _knn(
        self, query_vector: np.ndarray, k: int, ef: int, allowed: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Labels (rows) and distances of the k nearest, best first; `allowed`: the walk keeps to these rows."""
        return self._graph.knn(query_vector, k, ef, allowed)

    def _scored(self, labels: np.ndarray, distances: np.ndarray) -> list[ScoredChunk]:
        # "ip" distance is 1 - dot product.
        return [
            ScoredChunk(self._chunks[int(label)], float(1.0 - dist))
            for label, dist in zip(labels, distances, strict=True)
        ]

    def _scan(self, query_vector: np.ndarray, k: int, rows: np.ndarray) -> list[ScoredChunk]:
        """Exact search over `rows` only (their vectors are L2-normalized: the dot product is the cosine)."""
        if rows.size == 0:
            return []
        query = np.asarray(query_vector, dtype=np.float32).reshape(-1)
        # Slab by slab: a filter passing most of a million chunks would copy gigabytes of vectors.
        scores = np.concatenate(
            [self._slab_scores(query, rows[i : i + _EXACT_SLAB]) for i in range(0, rows.size, _EXACT_SLAB)]
        )
        k = min(k, rows.size)
        best = np.argpartition(-scores, k - 1)[:k]
        best = best[np.lexsort((rows[best], -scores[best]))]  # by score, then row: a stable order
        return [ScoredChunk(self._chunks[int(rows[i])], float(scores[i])) for i in best]

    def _slab_scores(self, query: np.ndarray, rows: np.ndarray) -> np.ndarray:
        if self._vectors is not None:
            vectors = np.asarray(self._vectors[rows], dtype=np.float32)
        else:
            vectors = self._graph.items(rows)
        # einsum, not a BLAS call: OpenBLAS's threads made this product 10-60x slower, erratically,
        # on a two-core host whose other core was busy (the server's model threads, the engine).
        return np.asarray(np.einsum("ij,j->i", vectors, query))

    @property
    def lexical_available(self) -> bool:
        return self._bm25 is not None

    def search_lexical(self, query: str, k: int, flt: Filter | None = None) -> list[ScoredChunk]:
        if self._bm25 is None:
            return []
        mask = None if flt is None else self._columns.mask(flt)
        return [ScoredChunk(self._chunks[row], score) for row, score in self._bm25.search(query, k, mask)]
