"""A version's HNSW graph, searched by row: in this process, or in a helper process (graph_process.py).

hnswlib's `load_index` holds Python's GIL while it reads the file, about 1.8 us a vector
(BENCHMARKS.md, "A million passages"): a hot reload of a big version in the serving process stalls
every request for that long. Loaded in a helper process, the load holds that process's GIL only.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Protocol

import hnswlib
import numpy as np

from ragserve.errors import IndexLoadError
from ragserve.index.hnsw_file import check_hnsw_file


class Graph(Protocol):
    """Nearest rows to a vector. Thread-safe. hnswlib raises RuntimeError when a filtered search
    finds fewer than k that pass; every implementation raises it then too."""

    @property
    def count(self) -> int: ...

    def knn(
        self, vector: np.ndarray, k: int, ef: int, allowed: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Rows and distances (1 - dot product) of the k nearest, best first, searching `ef` wide;
        `allowed`: a boolean mask by row that the walk itself keeps to (hnswlib's filter)."""
        ...

    def items(self, rows: np.ndarray) -> np.ndarray:
        """The stored vectors of `rows`, float32."""
        ...

    def close(self) -> None:
        """Let go of the graph (a helper process exits); searching it afterwards is an error."""
        ...


class LoadedGraph:
    """An hnswlib index in this process."""

    def __init__(self, index: hnswlib.Index) -> None:
        self._index = index
        self._lock = threading.Lock()

    @property
    def count(self) -> int:
        return int(self._index.get_current_count())

    def knn(
        self, vector: np.ndarray, k: int, ef: int, allowed: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        keep = None if allowed is None else (lambda label: bool(allowed[label]))
        # hnswlib's ef is index-wide state: set it and query under one lock so concurrent
        # requests with different breadths do not see each other's setting (a query is < 1 ms).
        with self._lock:
            self._index.set_ef(ef)
            labels, distances = self._index.knn_query(vector.reshape(1, -1), k=k, filter=keep)
        return labels[0], distances[0]

    def items(self, rows: np.ndarray) -> np.ndarray:
        return np.asarray(self._index.get_items(rows), dtype=np.float32)

    def close(self) -> None:
        """Nothing to release early: the index goes with its last reference."""


def load_graph(path: Path, dim: int, count: int, beside_requests: bool = False) -> LoadedGraph:
    """hnswlib's file at `path`, checked by `check_hnsw_file` first (hnswlib trusts it: a bad id is
    a segfault at the first search). In the process that loads it, the helper's for a big version,
    so a reload's pass over 1.8 GB holds the helper's GIL, not the server's. The load holds the GIL
    whatever its priority, so `beside_requests` changes nothing here."""
    check_hnsw_file(path, count, dim)
    index = hnswlib.Index(space="ip", dim=dim)
    try:
        index.load_index(str(path), max_elements=max(1, count))
    except RuntimeError as exc:
        raise IndexLoadError(f"index file {path} cannot be read: {exc}") from exc
    return LoadedGraph(index)
