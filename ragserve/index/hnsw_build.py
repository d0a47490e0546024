"""Building a version's HNSW graph and measuring the search breadth it needs (the server loads and
searches it: hnsw.py)."""

from __future__ import annotations

from pathlib import Path

import hnswlib
import numpy as np

from ragserve.index.vector_file import VectorFile

# A matrix of vectors, in memory or read from a file a slab at a time (vector_file.VectorFile).
Rows = np.ndarray | VectorFile

# Build-time defaults, chosen by measurement (benchmarks/bench_hnsw.py, BENCHMARKS.md); query-time
# breadth (ef) comes from settings per request.
DEFAULT_M = 32
DEFAULT_EF_CONSTRUCTION = 200
# A version's search breadth is measured when it is built (`measure_ef`): recall@10 against exact
# search, over this many probes, must reach the target. Probes halfway between two stored vectors
# are harder than questions: on SciFact they need about twice the ef for the same recall
# (BENCHMARKS.md, "A million passages"), which is the margin.
EF_RECALL_TARGET = 0.95
EF_STEPS = (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
_EF_PROBES = 200
_RECALL_AT = 10
_ADD_SLAB = 65536  # vectors read and inserted at a time
# `exact_top`'s slab: its scores, rows and partition for 200 probes cost ~90 MB at this width.
_TOP_SLAB = 16384


def build_hnsw(
    vectors: Rows,
    path: Path,
    m: int = DEFAULT_M,
    ef_construction: int = DEFAULT_EF_CONSTRUCTION,
    threads: int = -1,
) -> int:
    """Label i is row i of `vectors` (a matrix, or a VectorFile read a slab at a time) and line i
    of the docstore; `threads`: hnswlib's insertion threads (-1: every CPU). Returns the search
    breadth the graph needs (`measure_ef`), for the manifest."""
    count, dim = vectors.shape
    index = hnswlib.Index(space="ip", dim=dim)  # vectors are L2-normalized: ip == cosine
    index.init_index(max_elements=max(1, count), M=m, ef_construction=ef_construction, random_seed=100)
    for start in range(0, count, _ADD_SLAB):
        slab = np.asarray(vectors[start : start + _ADD_SLAB], dtype=np.float32)
        index.add_items(slab, np.arange(start, start + len(slab)), num_threads=threads)
    index.save_index(str(path))
    return measure_ef(index, vectors)


def measure_ef(index: hnswlib.Index, vectors: Rows, seed: int = 0) -> int:
    """The least ef (of EF_STEPS) at which the graph's top 10 holds EF_RECALL_TARGET of the exact
    top 10, for probes halfway between two stored vectors (away from any one, as questions are);
    0 for a corpus too small to ask. A bigger graph needs a wider search for the same recall."""
    count = len(vectors)
    if count <= _RECALL_AT:
        return 0
    rng = np.random.default_rng(seed)
    probes = vectors[rng.integers(0, count, _EF_PROBES)] + vectors[rng.integers(0, count, _EF_PROBES)]
    probes /= np.maximum(np.linalg.norm(probes, axis=1, keepdims=True), 1e-12)
    truth = exact_top(probes, vectors, _RECALL_AT)
    for ef in EF_STEPS:
        index.set_ef(ef)
        labels, _ = index.knn_query(probes, k=_RECALL_AT)
        found = sum(len(set(row.tolist()) & set(best.tolist())) for row, best in zip(labels, truth, strict=True))
        if found >= EF_RECALL_TARGET * _RECALL_AT * len(probes):
            return ef
    return EF_STEPS[-1]


def exact_top(queries: np.ndarray, vectors: Rows, k: int) -> np.ndarray:
    """Rows of the k best dot products per query (unordered), a slab of vectors at a time (bounded memory)."""
    best = np.zeros((len(queries), 0), dtype=np.int64)
    best_scores = np.zeros((len(queries), 0), dtype=np.float32)
    for start in range(0, len(vectors), _TOP_SLAB):
        scores = queries @ np.asarray(vectors[start : start + _TOP_SLAB], dtype=np.float32).T
        rows = np.broadcast_to(np.arange(start, start + scores.shape[1]), scores.shape)
        merged, merged_rows = np.hstack([best_scores, scores]), np.hstack([best, rows])
        top = np.argpartition(-merged, min(k, merged.shape[1]) - 1, axis=1)[:, :k]
        best, best_scores = np.take_along_axis(merged_rows, top, 1), np.take_along_axis(merged, top, 1)
    return best
