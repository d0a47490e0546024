"""A BM25 index built from chunks streamed in, in memory that does not grow with the corpus's
tokens: each batch of texts is tokenized as it comes (bm25s's tokenizer, stopwords and stemmer) and
its term ids spilled to a file; `finish` reads the spill twice (document frequencies, then scores)
a slab of chunks at a time, and holds only the score matrix it writes (bm25s's format, through
bm25s's own `save`).

The scores are bm25s's: its idf and term-frequency functions over the same counts, so the matrix
holds the values `bm25s.BM25().index` computes (tests/index/test_bm25_stream.py compares them).
Only the vocabulary's numbering differs: first seen here, where bm25s numbers a Python set (which
changes from run to run).
"""

from __future__ import annotations

import os
from array import array
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np

from ragserve.index.bm25 import BM25_DIR, STOPWORDS, quiet_bm25s, stemmer

_SLAB_CHUNKS = 65_536  # chunks per pass over the spill: ~7M term ids at ~110 a chunk


def build_bm25(texts: list[str], folder: Path) -> list[str]:
    """Index `texts` (row i = chunk i) into folder/bm25/; returns the written paths relative to folder."""
    builder = Bm25Builder(folder / "bm25.spill")
    builder.add(texts)
    return builder.finish(folder)


class Bm25Builder:
    """`add` texts (row i = the i-th text added), then `finish` into a version folder."""

    def __init__(self, spill: Path) -> None:
        quiet_bm25s()
        self._spill_path = spill
        self._spill = spill.open("wb")
        self._lengths = array("q")
        self._vocab: dict[str, int] = {}
        self._stemmer = stemmer()

    @property
    def count(self) -> int:
        return len(self._lengths)

    def add(self, texts: list[str]) -> None:
        import bm25s

        if not texts:
            return
        tokens = bm25s.tokenize(texts, stopwords=STOPWORDS, stemmer=self._stemmer, show_progress=False)
        to_global = np.zeros(len(tokens.vocab), dtype=np.uint32)
        for stem, local in tokens.vocab.items():
            to_global[local] = self._vocab.setdefault(stem, len(self._vocab))
        lengths = [len(ids) for ids in tokens.ids]
        flat = np.fromiter(chain.from_iterable(tokens.ids), dtype=np.int64, count=sum(lengths))
        self._spill.write(to_global[flat].tobytes())
        self._lengths.extend(lengths)

    def finish(self, folder: Path) -> list[str]:
        """The index into folder/bm25/; returns the written paths relative to `folder`. The spill
        is removed."""
        import bm25s
        from bm25s.scoring import _build_idf_array, _select_idf_scorer, _select_tfc_scorer

        self._spill.close()
        retriever = bm25s.BM25()
        if retriever.method in retriever.methods_requiring_nonoccurrence:
            raise ValueError(f"bm25s method {retriever.method!r} needs an array this builder does not make")
        lengths = np.frombuffer(self._lengths, dtype=np.int64)
        vocab_size = len(self._vocab)
        frequencies = np.zeros(vocab_size, dtype=np.int64)
        for _, terms, _ in self._postings(lengths, vocab_size):
            frequencies += np.bincount(terms, minlength=vocab_size)
        idf = _build_idf_array(
            dict(enumerate(frequencies.tolist())),
            len(lengths),
            _select_idf_scorer(retriever.idf_method or retriever.method),
            retriever.dtype,
        )
        tfc = _select_tfc_scorer(retriever.method)
        average = lengths.mean() if len(lengths) else np.float64(0)  # as bm25s: a numpy float64
        total = int(frequencies.sum())
        index_dtype = np.int32 if max(total, len(lengths), vocab_size) < np.iinfo(np.int32).max else np.int64
        indptr = np.zeros(vocab_size + 1, dtype=index_dtype)
        np.cumsum(frequencies, out=indptr[1:])
        heads = indptr[:-1].astype(np.int64)
        data = np.empty(total, dtype=retriever.dtype)
        indices = np.empty(total, dtype=index_dtype)
        for docs, terms, counts in self._postings(lengths, vocab_size):
            # One score per (chunk, term): bm25s's expression over the same counts and lengths.
            scores = idf[terms] * tfc(
                tf_array=counts.astype(retriever.dtype),
                l_d=lengths[docs],
                l_avg=average,
                k1=retriever.k1,
                b=retriever.b,
                delta=retriever.delta,
            )
            order = np.argsort(terms, kind="stable")  # by term, chunks ascending within each
            by_term = terms[order]
            rank = np.arange(len(by_term)) - np.searchsorted(by_term, by_term, side="left")
            slots = heads[by_term] + rank
            data[slots] = scores[order]
            indices[slots] = docs[order]
            heads += np.bincount(terms, minlength=vocab_size)
        os.unlink(self._spill_path)
        retriever.scores = {"data": data, "indices": indices, "indptr": indptr, "num_docs": len(lengths)}
        retriever.nonoccurrence_array = None  # what `index` sets for this method
        retriever.vocab_dict = {**self._vocab, "": vocab_size} if "" not in self._vocab else dict(self._vocab)
        target = folder / BM25_DIR
        retriever.save(str(target), show_progress=False)
        return sorted(p.relative_to(folder).as_posix() for p in target.rglob("*") if p.is_file())

    def _postings(self, lengths: np.ndarray, vocab_size: int) -> Any:
        """(chunk rows, term ids, counts) of each distinct (chunk, term), ordered by
        chunk then term, a slab of chunks at a time."""
        ends = np.cumsum(lengths)
        with self._spill_path.open("rb") as spill:
            for first in range(0, len(lengths), _SLAB_CHUNKS):
                last = min(first + _SLAB_CHUNKS, len(lengths))
                start = int(ends[first - 1]) if first else 0
                ids = np.fromfile(spill, dtype=np.uint32, count=int(ends[last - 1]) - start).astype(np.int64)
                rows = np.repeat(np.arange(first, last, dtype=np.int64), lengths[first:last])
                keys, counts = np.unique(rows * max(vocab_size, 1) + ids, return_counts=True)
                yield keys // max(vocab_size, 1), keys % max(vocab_size, 1), counts
