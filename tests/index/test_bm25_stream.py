"""The streamed BM25 build (tokens spilled, scores from the spill) holds the matrix bm25s's own
`index` computes for the same texts: the same stems, and the same float32 score for each."""

from __future__ import annotations

import random
from pathlib import Path

import bm25s
import numpy as np

from ragserve.index.bm25 import BM25_DIR, STOPWORDS, Bm25Index, stemmer
from ragserve.index.bm25_build import Bm25Builder

WORDS = [
    "cells",
    "patient",
    "running",
    "runs",
    "ran",
    "protein",
    "gene",
    "the",
    "of",
    "and",
    "immune",
    "response",
    "tumour",
    "growth",
    "a",
]


def _texts(count: int, seed: int = 3) -> list[str]:
    rng = random.Random(seed)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 40))) for _ in range(count)]
    texts[5] = ""  # no tokens at all
    texts[9] = "the of and a"  # stopwords only
    return texts


def _by_stem(data: np.ndarray, indices: np.ndarray, indptr: np.ndarray, vocab: dict[str, int]) -> dict:
    out = {}
    for stem, column in vocab.items():
        if column < len(indptr) - 1:
            lo, hi = indptr[column], indptr[column + 1]
            out[stem] = (indices[lo:hi].tolist(), data[lo:hi].tolist())
    return out


def test_streamed_scores_equal_bm25s_own(tmp_path: Path) -> None:
    texts = _texts(400)
    reference = bm25s.BM25()
    reference.index(
        bm25s.tokenize(texts, stopwords=STOPWORDS, stemmer=stemmer(), show_progress=False), show_progress=False
    )
    builder = Bm25Builder(tmp_path / "spill")
    for start in range(0, len(texts), 37):  # batches of any size
        builder.add(texts[start : start + 37])
    builder.finish(tmp_path)
    assert not (tmp_path / "spill").exists()
    built = bm25s.BM25.load(str(tmp_path / BM25_DIR), load_corpus=False)
    ref = reference.scores
    mine = built.scores
    assert mine["num_docs"] == ref["num_docs"] == len(texts)
    assert set(built.vocab_dict) == set(reference.vocab_dict)
    assert mine["data"].dtype == ref["data"].dtype and mine["indices"].dtype == ref["indices"].dtype
    assert _by_stem(mine["data"], mine["indices"], mine["indptr"], built.vocab_dict) == _by_stem(
        ref["data"], ref["indices"], ref["indptr"], reference.vocab_dict
    )


def test_the_streamed_index_loads_and_ranks(tmp_path: Path) -> None:
    builder = Bm25Builder(tmp_path / "spill")
    builder.add(["immune response of cells", "tumour growth"])
    builder.add(["gene expression in tumour cells"])
    builder.finish(tmp_path)
    index = Bm25Index.load(tmp_path, 3)
    assert [row for row, _ in index.search("tumour", 3)] == [1, 2]
