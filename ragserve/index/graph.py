"""A version's HNSW graph, searched by row: in this process, or in a helper process (graph_process.py).

hnswlib's `load_index` holds Python's GIL while it reads the file, about 1.8 us a vector
(BENCHMARKS.md, "A million passages"): a hot reload of a big version in the serving process stalls
every request for that long. Loaded in a helper process, the load holds that process's GIL only.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import hnswlib
import numpy as np

from ragserve.errors import IndexLoadError
from ragserve.index.hnsw_file import check_hnsw_file


class Graph(Protocol):
    """Nearest rows to a vector. Thread-safe. hnswlib raises RuntimeError when a walk filtered by
    `allowed` finds fewer than k that pass; every implementation raises it then too (its caller
    scans instead). A version's bound to its own rows is no such filter: a short walk there is an
    answer."""

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


@dataclass(frozen=True)
class GraphFile:
    """A version's graph file, as its opener is told of it."""

    path: Path
    dim: int
    count: int
    beside_requests: bool = False  # requests are served meanwhile (a hot reload)
    version: str = ""  # the version's identity
    # (identity, rows) of the version whose graph this one is, with rows `rows`.. appended (the
    # indexer extended it): a helper serving that version can grow its graph instead of loading this.
    base: tuple[str, int] | None = None
    vectors: Path | None = None  # the version's vectors, row i = label i (what is appended)


class _Turns:
    """Searches, or one append: never both (hnswlib: add_items beside knn_query is unsafe). An
    append waits while searches run or wait, so a search waits for one batch of appends at most;
    in the helper searches come one at a time, so appends find gaps."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._searching = 0
        self._waiting = 0
        self._appending = False

    @contextlib.contextmanager
    def search(self) -> Iterator[None]:
        with self._cond:
            self._waiting += 1
            self._cond.wait_for(lambda: not self._appending)
            self._waiting -= 1
            self._searching += 1
        try:
            yield
        finally:
            with self._cond:
                self._searching -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def append(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not (self._searching or self._waiting or self._appending))
            self._appending = True
        try:
            yield
        finally:
            with self._cond:
                self._appending = False
                self._cond.notify_all()


# Rows one append adds between searches: a search beside a growing graph waits for this many
# insertions at most (about 1 ms each at a million rows).
_APPEND_BATCH = 8


class LoadedGraph:
    """An hnswlib index in this process."""

    def __init__(self, index: hnswlib.Index) -> None:
        self._index = index
        self._lock = threading.Lock()
        self._turns = _Turns()

    @property
    def count(self) -> int:
        return int(self._index.get_current_count())

    @property
    def dim(self) -> int:
        return int(self._index.dim)

    @property
    def capacity(self) -> int:
        """Rows it has room for: more than `count` while rows are being appended."""
        return int(self._index.get_max_elements())

    def knn(
        self, vector: np.ndarray, k: int, ef: int, allowed: np.ndarray | None = None, rows: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """`rows`: only labels below it (a version served from a graph grown since, or growing:
        graph_process.py); then fewer than k only when the walk finds fewer."""
        with self._turns.search():
            if rows is not None and allowed is None:
                return self._own_rows(vector, k, ef, rows)
            return self._query(vector, k, ef, _keep(allowed, rows))

    def _own_rows(self, vector: np.ndarray, k: int, ef: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
        # Most of the nearest are the version's own: ask for more, unfiltered, and drop the
        # rest. A Python filter is called at every node the walk visits.
        k = min(k, rows)
        wanted = min(2 * k + 8, max(self.count, 1))
        with contextlib.suppress(RuntimeError):
            labels, distances = self._query(vector, wanted, max(ef, wanted), None)
            own = labels < rows
            if int(np.count_nonzero(own)) >= k:
                return labels[own][:k], distances[own][:k]
        return self._most_found(vector, k, max(2 * ef, k), _keep(None, rows))

    def _most_found(
        self, vector: np.ndarray, k: int, ef: int, keep: Callable[[int], bool] | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The best k the walk finds, or all it finds when fewer (hnswlib raises then). A walk
        `ef` >= k wide finds the same rows whatever k, so all it found is the most k that answers."""
        try:
            return self._query(vector, k, ef, keep)
        except RuntimeError:
            pass
        found = np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.float32)
        answers, short = 0, k
        while short - answers > 1:
            middle = (answers + short) // 2
            try:
                found, answers = self._query(vector, middle, ef, keep), middle
            except RuntimeError:
                short = middle
        return found

    def _query(
        self, vector: np.ndarray, k: int, ef: int, keep: Callable[[int], bool] | None
    ) -> tuple[np.ndarray, np.ndarray]:
        # hnswlib's ef is index-wide state: set it and query under one lock so concurrent
        # requests with different breadths do not see each other's setting (a query is < 1 ms).
        with self._lock:
            self._index.set_ef(ef)
            labels, distances = self._index.knn_query(vector.reshape(1, -1), k=k, filter=keep)
        return labels[0], distances[0]

    def items(self, rows: np.ndarray) -> np.ndarray:
        with self._turns.search():
            return np.asarray(self._index.get_items(rows), dtype=np.float32)

    def make_room(self, count: int) -> None:
        """Room for `count` vectors (hnswlib reallocates: nothing searches or adds meanwhile)."""
        with self._turns.append():
            if count > self._index.get_max_elements():
                self._index.resize_index(count)

    def append(self, vectors: np.ndarray, first: int) -> None:
        """Adds `vectors` as labels first.. on one thread (so the graph comes out as the indexer's
        one-thread extension does, vector for vector), a batch at a time between searches;
        releases the GIL while it works."""
        for start in range(0, len(vectors), _APPEND_BATCH):
            batch = vectors[start : start + _APPEND_BATCH]
            with self._turns.append():
                self._index.add_items(batch, np.arange(first + start, first + start + len(batch)), num_threads=1)

    def close(self) -> None:
        """Nothing to release early: the index goes with its last reference."""


def _keep(allowed: np.ndarray | None, rows: int | None) -> Callable[[int], bool] | None:
    if rows is None:
        return None if allowed is None else (lambda label: bool(allowed[label]))
    if allowed is None:
        return lambda label: label < rows
    return lambda label: label < rows and bool(allowed[label])


def open_in_process(file: GraphFile) -> LoadedGraph:
    return load_graph(file.path, file.dim, file.count)


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
