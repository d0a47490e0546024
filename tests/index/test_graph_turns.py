"""A graph grown while it is searched (the helper's growth thread beside its searches): no search
runs while rows are added (hnswlib's add_items beside knn_query is unsafe), each keeps to the rows
asked for, and a walk that finds fewer than k answers with what it found."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import hnswlib
import numpy as np

from ragserve.index.graph import LoadedGraph
from ragserve.index.graph_helper import _answer, _Growth

DIM = 8


def _unit(n: int, seed: int) -> np.ndarray:
    vectors = np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def _index(vectors: np.ndarray) -> hnswlib.Index:
    index = hnswlib.Index(space="ip", dim=DIM)
    index.init_index(max_elements=len(vectors), M=16, ef_construction=100, random_seed=1)
    index.add_items(vectors, np.arange(len(vectors)), num_threads=1)
    return index


class _Watched:
    """An hnswlib index that counts the times a search and an add ran at once."""

    def __init__(self, index: hnswlib.Index) -> None:
        self.index = index
        self._guard = threading.Lock()
        self._running = {"search": 0, "add": 0}
        self.overlaps = 0
        self.adds = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.index, name)

    def _enter(self, what: str, other: str) -> None:
        with self._guard:
            self._running[what] += 1
            self.overlaps += self._running[other] > 0

    def _leave(self, what: str) -> None:
        with self._guard:
            self._running[what] -= 1

    def knn_query(self, *args: Any, **kwargs: Any) -> Any:
        self._enter("search", "add")
        try:
            return self.index.knn_query(*args, **kwargs)
        finally:
            self._leave("search")

    def add_items(self, *args: Any, **kwargs: Any) -> Any:
        self._enter("add", "search")
        try:
            time.sleep(0.0002)  # an add as slow as one at a million rows: room for a search beside it
            self.adds += 1
            return self.index.add_items(*args, **kwargs)
        finally:
            self._leave("add")


def test_thousands_of_searches_beside_the_helpers_growth_never_run_during_an_add(tmp_path: Path) -> None:
    """The helper's own loop: its growth thread appends from the vectors file while searches of the
    old version's 2,000 rows come in, near the rows being added (which the walk must pass over)."""
    vectors = _unit(6000, 3)
    np.save(tmp_path / "vectors.npy", vectors)
    index = _Watched(_index(vectors[:2000]))
    graph = LoadedGraph(index)  # type: ignore[arg-type]
    growth = _Growth()
    assert growth.start(graph, tmp_path / "vectors.npy", 2000, 6000, 0) == ("ok", None)
    rng = np.random.default_rng(11)
    for i in range(3000):
        k = int(rng.integers(1, 21))
        query = vectors[rng.integers(2000, 6000)]
        status, (labels, distances) = _answer(graph, growth, ("knn", query, k, 32, None, 2000))
        assert status == "ok" and len(labels) == k and labels.max() < 2000, (i, status, labels)
        assert np.all(np.diff(distances) >= 0)
        time.sleep(0)  # the helper waits for its next request here, without the GIL
    deadline = time.monotonic() + 60
    while growth.state == "running" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert growth.state == "done" and graph.count == 6000 and index.adds > 0
    assert index.overlaps == 0
    assert graph.knn(vectors[5999], 1, 64)[0][0] == 5999  # the grown graph finds the new rows


def test_an_append_waits_for_a_search_and_a_search_for_one_batch() -> None:
    vectors = _unit(600, 5)
    index = _Watched(_index(vectors[:200]))
    graph = LoadedGraph(index)  # type: ignore[arg-type]
    graph.make_room(600)
    grower = threading.Thread(target=graph.append, args=(vectors[200:], 200))
    grower.start()
    while grower.is_alive():
        assert graph.knn(vectors[0], 5, 32, rows=200)[0].max() < 200
        assert graph.items(np.array([0, 199])).shape == (2, DIM)
        time.sleep(0)
    grower.join()
    assert graph.count == 600 and index.adds == 50  # 400 rows, 8 a batch
    assert index.overlaps == 0


class _Short:
    """A graph whose filtered walk finds only `found` rows: hnswlib raises for any larger k."""

    def __init__(self, index: hnswlib.Index, found: int) -> None:
        self.index = index
        self.found = found
        self.asked: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.index, name)

    def knn_query(self, vector: np.ndarray, k: int, filter: Any = None) -> Any:
        self.asked.append(k)
        if filter is None:  # unfiltered: the nearest are the new rows, none the version's own
            return np.full((1, k), 10_000, dtype=np.uint64), np.zeros((1, k), dtype=np.float32)
        if k > self.found:
            raise RuntimeError("Cannot return the results in a contiguous 2D array. Probably ef or M is too small")
        return self.index.knn_query(vector, k=k, filter=filter)


def test_a_walk_that_finds_fewer_than_k_answers_with_all_it_found() -> None:
    vectors = _unit(300, 9)
    for found in (0, 1, 6, 9):
        short = _Short(_index(vectors), found)
        labels, distances = LoadedGraph(short).knn(vectors[0], 10, 32, rows=300)  # type: ignore[arg-type]
        assert len(labels) == len(distances) == found
        if found:  # the best `found` of the same walk
            short.index.set_ef(64)
            want = short.index.knn_query(vectors[0].reshape(1, -1), k=found, filter=lambda label: label < 300)[0][0]
            assert labels.tolist() == want.tolist()
        assert len(short.asked) <= 6  # the unfiltered ask, k, then a bisection of 1..k


def test_a_view_of_more_rows_than_the_helper_holds_is_refused_not_searched() -> None:
    graph = LoadedGraph(_index(_unit(100, 2)))
    status, why = _answer(graph, _Growth(), ("knn", _unit(1, 4)[0], 5, 32, None, 150))
    assert status == "error" and "holds 100 rows, not 150" in why
