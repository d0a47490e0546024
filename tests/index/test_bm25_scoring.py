"""The lexical index's own scoring (postings only) ranks as bm25s's retrieve does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ragserve.index.bm25 import Bm25Index
from ragserve.index.bm25_build import build_bm25

TEXTS = [
    "The honey bee waggle dance encodes the distance and direction to food.",
    "Bees dance in the hive; the angle of the dance points at the food source.",
    "A Bloom filter answers membership queries with false positives but no false negatives.",
    "Kubernetes restarts a container killed by the OOM killer with exit status 137.",
    "The OOM killer picks a process by its badness score when memory runs out.",
    "Honey is stored by bees in wax cells; the hive keeps it for winter food.",
    "Membership in a set: a Bloom filter, a hash set, or a sorted array.",
    "Distance and direction: the dance's duration and angle.",
]
QUERIES = [
    "bee dance food distance",
    "bloom filter membership",
    "OOM killer exit status",
    "dance dance dance",
    "honey hive",
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("bm25")
    build_bm25(TEXTS, folder)
    return folder


@pytest.fixture(scope="module")
def index(folder: Path) -> Bm25Index:
    return Bm25Index.load(folder, len(TEXTS))


def _bm25s_ranking(folder: Path, terms: list[str], k: int, mask: np.ndarray | None) -> list[tuple[int, float]]:
    """bm25s's own retrieve over the same files (the reference)."""
    import bm25s

    retriever = bm25s.BM25.load(str(folder / "bm25"), load_corpus=False)
    weights = None if mask is None else mask.astype(np.float32)
    rows, scores = retriever.retrieve([terms], k=k, show_progress=False, n_threads=1, weight_mask=weights)
    return [(int(r), float(s)) for r, s in zip(rows[0], scores[0], strict=True) if s > 0.0]


@pytest.mark.parametrize("query", QUERIES)
@pytest.mark.parametrize("masked", [False, True], ids=["all rows", "masked"])
def test_scores_and_order_match_bm25s(folder: Path, index: Bm25Index, query: str, masked: bool) -> None:
    mask = np.array([i % 2 == 0 for i in range(len(TEXTS))]) if masked else None
    ours = index.search(query, k=4, mask=mask)
    reference = _bm25s_ranking(folder, index._terms(query), 4, mask)
    assert ours, "every query has an indexed term"
    assert [row for row, _ in ours] == [row for row, _ in sorted(reference, key=lambda p: (-p[1], p[0]))]
    assert np.allclose([s for _, s in ours], sorted((s for _, s in reference), reverse=True), rtol=1e-5)
    if mask is not None:
        assert all(mask[row] for row, _ in ours)


def test_a_repeated_term_counts_each_time(index: Bm25Index) -> None:
    once, thrice = index.search("dance", k=1), index.search("dance dance dance", k=1)
    assert once[0][0] == thrice[0][0] and thrice[0][1] == pytest.approx(3 * once[0][1])


def test_unknown_terms_and_a_mask_that_leaves_nothing_give_no_rows(index: Bm25Index) -> None:
    assert index.search("zzzunknown", k=3) == []
    assert index.search("bee", k=3, mask=np.zeros(len(TEXTS), dtype=bool)) == []
    assert index.search("bee", k=0) == []
