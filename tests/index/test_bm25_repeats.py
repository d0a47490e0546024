"""A query term repeated many times, or a query of very many terms: the lexical index scores a
distinct term once, weighted by its count (the same scores as bm25s's), so a repeat costs no
memory, and past its bounds it keeps the rarest terms."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from ragserve.index import bm25
from ragserve.index.bm25 import Bm25Index
from ragserve.index.bm25_build import build_bm25

TEXTS = [
    "The honey bee waggle dance encodes the distance and direction to food.",
    "Bees dance in the hive; the angle of the dance points at the food source.",
    "Honey is stored by bees in wax cells; the hive keeps it for winter food.",
    "Distance and direction: the dance's duration and angle.",
    "A Bloom filter answers membership queries with false positives.",
    "Wax cells hold honey and pollen; the dance tells where pollen is.",
]
REPEATED = [
    "dance dance dance bee food food",
    "honey " * 7 + "wax hive hive",
    "pollen dance pollen dance pollen",
]
# One term in every document, so each repeat of it (before the fix) copied every row's posting.
MANY = 20_000
REPEATS = 500


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("bm25_repeats")
    build_bm25(TEXTS, folder)
    return folder


@pytest.fixture(scope="module")
def index(folder: Path) -> Bm25Index:
    return Bm25Index.load(folder, len(TEXTS))


def _bm25s_scores(folder: Path, terms: list[str], mask: np.ndarray | None) -> list[tuple[int, float]]:
    """bm25s's own retrieve over the same files, every row with a positive score (the reference)."""
    import bm25s

    retriever = bm25s.BM25.load(str(folder / "bm25"), load_corpus=False)
    weights = None if mask is None else mask.astype(np.float32)
    rows, scores = retriever.retrieve([terms], k=len(TEXTS), show_progress=False, n_threads=1, weight_mask=weights)
    pairs = [(int(r), float(s)) for r, s in zip(rows[0], scores[0], strict=True) if s > 0.0]
    return sorted(pairs, key=lambda p: (-p[1], p[0]))


@pytest.mark.parametrize("query", REPEATED)
@pytest.mark.parametrize("masked", [False, True], ids=["all rows", "masked"])
def test_repeated_terms_score_as_bm25s(folder: Path, index: Bm25Index, query: str, masked: bool) -> None:
    mask = np.array([i % 2 == 1 for i in range(len(TEXTS))]) if masked else None
    terms = index._terms(query)
    assert len(set(terms)) < len(terms), "the query repeats a term"
    ours = index.search(query, k=len(TEXTS), mask=mask)
    reference = _bm25s_scores(folder, terms, mask)
    assert ours
    assert [row for row, _ in ours] == [row for row, _ in reference]
    assert np.allclose([s for _, s in ours], [s for _, s in reference], rtol=1e-5)


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> Bm25Index:
    folder = tmp_path_factory.mktemp("bm25_many")
    build_bm25([f"common passage {i} topic{i % 97}" for i in range(MANY)], folder)
    return Bm25Index.load(folder, MANY)


def _peak(index: Bm25Index, query: str) -> int:
    """Bytes allocated at the peak of one search, over what was held before it."""
    index.search(query, k=10)  # warm: the tokenizer's and stemmer's caches
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        index.search(query, k=10)
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


def test_a_term_repeated_500_times_allocates_no_more_than_once(many: Bm25Index) -> None:
    once = _peak(many, "common")
    repeated = _peak(many, " ".join(["common"] * REPEATS))
    print(f"tracemalloc peak: once {once} B, {REPEATS} times {repeated} B")
    # The slack covers the longer query's text and token list (a few KiB), not one more posting
    # list (20,000 rows: 80 KiB of row ids and scores before the fix, per repeat).
    assert repeated <= once + 32 * 1024
    assert many.search(" ".join(["common"] * REPEATS), k=1)[0][1] == pytest.approx(
        REPEATS * many.search("common", k=1)[0][1], rel=1e-5
    )


# Document frequencies 1, 2 and 4: "zebra" is the rarest term, "lion" the commonest.
BOUNDED = ["zebra giraffe lion", "giraffe lion", "lion", "lion", "an otter"]


@pytest.fixture(scope="module")
def bounded(tmp_path_factory: pytest.TempPathFactory) -> Bm25Index:
    folder = tmp_path_factory.mktemp("bm25_bounded")
    build_bm25(BOUNDED, folder)
    return Bm25Index.load(folder, len(BOUNDED))


def test_the_bound_on_distinct_terms_keeps_the_rarest(bounded: Bm25Index, monkeypatch: pytest.MonkeyPatch) -> None:
    rarest_two = bounded.search("zebra giraffe", k=5)
    monkeypatch.setattr(bm25, "_MAX_TERMS", 2)
    # The commonest term is left out however often it is repeated, wherever it stands.
    assert bounded.search("lion lion lion zebra giraffe", k=5) == rarest_two
    monkeypatch.setattr(bm25, "_MAX_TERMS", 1)
    assert bounded.search("lion giraffe giraffe zebra", k=5) == bounded.search("zebra", k=5)


def test_the_bound_on_postings_keeps_the_rarest(bounded: Bm25Index, monkeypatch: pytest.MonkeyPatch) -> None:
    everything = bounded.search("zebra giraffe lion", k=5)
    rarest_two = bounded.search("zebra giraffe", k=5)
    monkeypatch.setattr(bm25, "_MAX_POSTINGS", 3)  # zebra (1) and giraffe (2) fit; lion's 4 more do not
    assert bounded.search("lion zebra giraffe", k=5) == rarest_two != everything
    # The rarest term is scored even when it alone is over the bound: an answer, never an error.
    monkeypatch.setattr(bm25, "_MAX_POSTINGS", 0)
    assert bounded.search("lion giraffe", k=5) == bounded.search("giraffe", k=5) != []


def test_a_query_of_many_distinct_terms_is_answered(many: Bm25Index) -> None:
    query = " ".join(f"topic{i}" for i in range(97)) + " common"
    hits = many.search(query, k=3)
    assert len(hits) == 3 and all(score > 0.0 for _, score in hits)
