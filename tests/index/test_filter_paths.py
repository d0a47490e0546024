"""The ways the local index searches with a filter, each held to the exact filtered answer: an exact
scan (few pass), neighbours kept if they pass (many pass), and, when the passing chunks lie far from
the question so the nearest neighbours hold too few of them, the exact scan again, slab by slab:
never hnswlib's filtered walk, whose Python call per visited node is unbounded."""

from __future__ import annotations

from pathlib import Path

import hnswlib
import numpy as np
import pytest

from ragserve.filters import Filter, Match
from ragserve.index.format import Manifest
from ragserve.index.hnsw import HnswIndex
from ragserve.types import Chunk

N, DIM = 3000, 32


@pytest.fixture(scope="module")
def index() -> HnswIndex:
    rng = np.random.default_rng(7)
    vectors = rng.normal(size=(N, DIM)).astype(np.float32)
    # Rows 0..149 ("far") point away from the question used below; the rest are random.
    vectors[:150] = -np.abs(vectors[:150]) - 1.0
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    graph = hnswlib.Index(space="ip", dim=DIM)
    graph.init_index(max_elements=N, M=16, ef_construction=100, random_seed=1)
    graph.add_items(vectors, np.arange(N))
    chunks = [
        Chunk(f"d{i}#0", f"d{i}", f"text {i}", metadata={"side": "far" if i < 150 else "near", "half": str(i % 2)})
        for i in range(N)
    ]
    manifest = Manifest(1, "test", DIM, N, {}, fields={"side": "keyword", "half": "keyword"})
    return HnswIndex(Path("."), manifest, "ident", graph, chunks, None, vectors)


def _exact(index: HnswIndex, query: np.ndarray, flt: Filter, k: int) -> list[str]:
    keep = [c for c in index.chunks if all(c.metadata[m.key] in m.values for m in flt.must)]  # type: ignore[union-attr]
    scored = sorted(keep, key=lambda c: -float(index._vectors[int(c.doc_id[1:])] @ query))  # type: ignore[index]
    return [c.chunk_id for c in scored[:k]]


@pytest.mark.parametrize(
    ("flt", "scan_max"),
    [
        (Filter(must=(Match("side", ("far",)),)), 20_000),  # few pass: the exact scan
        (Filter(must=(Match("half", ("0",)),)), 0),  # half pass: neighbours kept if they pass
        (Filter(must=(Match("side", ("far",)),)), 0),  # pass but far away: the scan after all
    ],
    ids=["scan", "neighbours-kept", "far-scan"],
)
def test_each_path_finds_the_exact_filtered_top_k(index: HnswIndex, flt: Filter, scan_max: int) -> None:
    query = np.ones(DIM, dtype=np.float32) / np.sqrt(DIM)
    index.exact_scan_max = scan_max
    hits = index.search(query, 10, 64, flt)
    expected = _exact(index, query, flt, 10)
    assert len(hits) == 10
    assert len({h.chunk.chunk_id for h in hits} & set(expected)) >= 9
    assert all(all(h.chunk.metadata[m.key] in m.values for m in flt.must) for h in hits)  # type: ignore[union-attr]


def test_far_passing_chunks_never_make_the_graph_call_back_per_node(
    index: HnswIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ragserve.index import hnsw

    walked: list[object] = []
    real = index._graph.knn

    def knn(vector: np.ndarray, k: int, ef: int, allowed: np.ndarray | None = None) -> object:
        walked.append(allowed)
        return real(vector, k, ef, allowed)

    monkeypatch.setattr(index._graph, "knn", knn)
    monkeypatch.setattr(hnsw, "_EXACT_SLAB", 64)  # many slabs: their top k joined is the whole top k
    index.exact_scan_max = 0
    query = np.ones(DIM, dtype=np.float32) / np.sqrt(DIM)
    flt = Filter(must=(Match("side", ("far",)),))
    hits = index.search(query, 10, 64, flt)
    assert all(allowed is None for allowed in walked)  # no per-node callback
    assert [h.chunk.chunk_id for h in hits] == _exact(index, query, flt, 10)
