"""Lexical BM25 index (bm25s) over the same chunks, rows aligned with the dense index's labels."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ragserve.errors import IndexLoadError

BM25_DIR = "bm25"
_STOPWORDS = "en"


def _stemmer() -> Any:
    import Stemmer

    return Stemmer.Stemmer("english")


def _quiet() -> None:
    # bm25s logs a line per load/save at INFO; the indexer and server report their own summaries.
    logging.getLogger("bm25s").setLevel(logging.WARNING)


def build_bm25(texts: list[str], folder: Path) -> list[str]:
    """Index `texts` (row i = chunk i) into folder/bm25/; returns the written paths relative to folder."""
    import bm25s

    _quiet()
    target = folder / BM25_DIR
    tokens = bm25s.tokenize(texts, stopwords=_STOPWORDS, stemmer=_stemmer(), show_progress=False)
    retriever = bm25s.BM25()
    retriever.index(tokens, show_progress=False)
    retriever.save(str(target))
    return sorted(p.relative_to(folder).as_posix() for p in target.rglob("*") if p.is_file())


class Bm25Index:
    """A loaded BM25 index. bm25s scoring is read-only and safe from several threads."""

    def __init__(self, retriever: Any, count: int) -> None:
        self._retriever = retriever
        self._stemmer = _stemmer()
        self.count = count

    @classmethod
    def load(cls, folder: Path, count: int) -> Bm25Index:
        import bm25s

        _quiet()
        try:
            retriever = bm25s.BM25.load(str(folder / BM25_DIR))
        except (OSError, ValueError, KeyError) as exc:
            raise IndexLoadError(f"BM25 index at {folder / BM25_DIR} cannot be read: {exc}") from exc
        docs = int(retriever.scores.get("num_docs", count)) if isinstance(retriever.scores, dict) else count
        if docs != count:
            raise IndexLoadError(f"BM25 index at {folder} holds {docs} chunks, manifest says {count}")
        return cls(retriever, count)

    def search(self, query: str, k: int) -> list[tuple[int, float]]:
        """(row, score) for the k best rows with a positive score, best first."""
        import bm25s

        k = min(k, self.count)
        tokens = bm25s.tokenize(
            [query], stopwords=_STOPWORDS, stemmer=self._stemmer, return_ids=False, show_progress=False
        )
        if k <= 0 or not tokens or not tokens[0]:
            return []
        rows, scores = self._retriever.retrieve(tokens, k=k, show_progress=False, n_threads=1)
        return [(int(r), float(s)) for r, s in zip(rows[0], scores[0], strict=True) if s > 0.0]


def bm25_terms(texts: list[str]) -> list[list[str]]:
    """The same analysis as the local index (English stopwords, Snowball stemmer), as term lists."""
    import bm25s

    _quiet()
    out = bm25s.tokenize(texts, stopwords=_STOPWORDS, stemmer=_stemmer(), return_ids=False, show_progress=False)
    return [list(terms) for terms in out]
