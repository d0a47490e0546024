"""Lexical BM25 index (bm25s) over the same chunks, rows aligned with the dense index's labels.

bm25s trusts its folder: params.index.json is passed to BM25(**params) as is (an unknown key is a
TypeError; "backend": "numba" selects a scorer without bounds checks), and the score matrix is
used as stored. As with hnsw.bin, the checksum cannot catch a crafted folder, so the params are
checked before bm25s reads them, the numpy backend is forced, and the arrays are checked (with
numpy, a fraction of the load) before the first query.
"""

from __future__ import annotations

import json
import logging
import math
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ragserve.errors import IndexLoadError

BM25_DIR = "bm25"
STOPWORDS = "en"
_PARAMS_FILE = "params.index.json"
_VOCAB_FILE = "vocab.index.json"
_DATA_FILE = "data.csc.index.npy"
_INDICES_FILE = "indices.csc.index.npy"
_INDPTR_FILE = "indptr.csc.index.npy"
# The score matrix's files and the numpy dtype kinds each may hold (scores; row and column offsets).
_ARRAYS = {_DATA_FILE: "f", _INDICES_FILE: "iu", _INDPTR_FILE: "iu"}
# A query's work is bounded whatever its text (a long question and the history turn searched with
# it may list or repeat many common words): past these bounds the commonest terms (longest postings,
# lowest IDF, least telling) are left out, the rarest kept. A question rarely holds more than a few
# dozen distinct content terms; four million postings is four terms found in every one of a million
# chunks, tens of milliseconds of numpy.
_MAX_TERMS = 64
_MAX_POSTINGS = 4_000_000


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


# Every key bm25s 0.3 writes to params.index.json, and the values a loadable index may hold.
# "method" excludes bm25l/bm25+, which read one more array (never built here) at load.
_PARAMS: dict[str, Callable[[Any], bool]] = {
    "k1": _is_number,
    "b": _is_number,
    "delta": _is_number,
    "method": lambda v: v in ("robertson", "lucene", "atire"),
    "idf_method": lambda v: v is None or v in ("robertson", "lucene", "atire", "bm25l", "bm25+"),
    "dtype": lambda v: v in ("float32", "float64"),
    "int_dtype": lambda v: v in ("int32", "int64"),
    "num_docs": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
    "version": lambda v: isinstance(v, str),
    "backend": lambda v: v == "numpy",
}


def stemmer() -> Any:
    import Stemmer

    return Stemmer.Stemmer("english")


def quiet_bm25s() -> None:
    # bm25s logs a line per load/save at INFO; the indexer and server report their own summaries.
    logging.getLogger("bm25s").setLevel(logging.WARNING)


class Bm25Index:
    """A loaded BM25 index. Scoring is read-only and safe from several threads.

    A query adds up only its terms' postings of bm25s's precomputed score matrix: its cost follows
    the postings it touches, not the corpus size as bm25s's own retrieve does (a score per row,
    then a top-k over every row, on a thread of its own: BENCHMARKS.md, "A million passages").
    """

    def __init__(self, retriever: Any, count: int) -> None:
        self._stemmer = stemmer()
        self.count = count
        scores = retriever.scores
        self._data: np.ndarray = scores["data"]
        self._indices: np.ndarray = scores["indices"]
        self._indptr: np.ndarray = scores["indptr"]
        self._vocab: dict[str, int] = retriever.vocab_dict

    @classmethod
    def load(cls, folder: Path, count: int) -> Bm25Index:
        import bm25s

        quiet_bm25s()
        target = folder / BM25_DIR
        params = _read_params(target / _PARAMS_FILE)
        if params["num_docs"] != count:
            raise IndexLoadError(f"BM25 index at {folder} holds {params['num_docs']} chunks, manifest says {count}")
        if not (target / _VOCAB_FILE).is_file():
            raise _invalid(target / _VOCAB_FILE, "missing")
        for name, kinds in _ARRAYS.items():
            _check_npy(target / name, kinds)
        try:
            # The checked params override whatever bm25s reads back; numpy is the bounds-checked backend.
            retriever = bm25s.BM25.load(
                str(target),
                mmap=False,
                allow_pickle=False,
                load_corpus=False,
                override_params={**params, "backend": "numpy", "auto_compile": False},
            )
        except Exception as exc:
            # Whatever bm25s raises on these files (a TypeError, an AttributeError on a vocab that
            # is not an object...) means the folder cannot be read: refuse it like a bad checksum.
            raise IndexLoadError(f"BM25 index at {target} cannot be read: {exc}") from exc
        if retriever.backend != "numpy":
            raise IndexLoadError(f"BM25 index at {target} did not load with the numpy backend")
        _check_arrays(target, retriever.scores, retriever.vocab_dict, count)
        return cls(retriever, count)

    def search(self, query: str, k: int, mask: np.ndarray | None = None) -> list[tuple[int, float]]:
        """(row, score) for the k best rows with a positive score, best first (ties by row); only
        rows where `mask` is True when one is given."""
        k = min(k, self.count)
        if k <= 0:
            return []
        columns = self._columns(self._terms(query))
        if not columns:
            return []
        totals = np.zeros(self.count, dtype=np.float64)
        for column, times in columns:
            start, end = int(self._indptr[column]), int(self._indptr[column + 1])
            rows, values = self._indices[start:end], self._data[start:end].astype(np.float64)
            if mask is not None:
                keep = mask[rows]
                rows, values = rows[keep], values[keep]
            # A term repeated in the query counts each time, as in bm25s: its postings once, times n.
            if times > 1:
                values *= times
            np.add.at(totals, rows, values)  # adds a repeated row twice, as bm25s does
        touched = np.flatnonzero(totals > 0.0)
        if touched.size > k:
            touched = touched[np.argpartition(-totals[touched], k - 1)[:k]]
        best = touched[np.lexsort((touched, -totals[touched]))]
        return [(int(row), float(totals[row])) for row in best]

    def _terms(self, query: str) -> list[str]:
        import bm25s

        tokens = bm25s.tokenize(
            [query], stopwords=STOPWORDS, stemmer=self._stemmer, return_ids=False, show_progress=False
        )
        return list(tokens[0]) if tokens else []

    def _columns(self, terms: list[str]) -> list[tuple[int, int]]:
        """(column, times in the query) for each distinct known term, rarest first, within the
        bounds; the rarest term is always kept (its postings name a row at most once)."""
        last = self._indptr.size - 1  # bm25s's empty-token id (== last) names no column
        counts = Counter(i for i in (self._vocab.get(t, last) for t in terms) if i < last)
        # A column's length is the term's document frequency: the shorter, the higher its IDF.
        lengths = {column: int(self._indptr[column + 1] - self._indptr[column]) for column in counts}
        kept: list[tuple[int, int]] = []
        total = 0
        for column in sorted(counts, key=lambda c: (lengths[c], c)):
            if len(kept) == _MAX_TERMS or (kept and total + lengths[column] > _MAX_POSTINGS):
                break  # every term left is as common or commoner
            kept.append((column, counts[column]))
            total += lengths[column]
        return kept


def _read_params(path: Path) -> dict[str, Any]:
    """params.index.json, holding only keys bm25s writes, with values a loadable index may hold."""
    try:
        params = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError) as exc:
        raise IndexLoadError(f"BM25 file {path} cannot be read: {exc}") from exc
    if not isinstance(params, dict):
        raise _invalid(path, "not a JSON object")
    unknown = sorted(set(params) - _PARAMS.keys())
    if unknown:
        raise _invalid(path, f"unknown parameters {unknown}")
    if "num_docs" not in params:
        raise _invalid(path, "num_docs is missing")
    for key, allowed in _PARAMS.items():
        if key in params and not allowed(params[key]):
            raise _invalid(path, f"{key} = {params[key]!r} is not allowed")
    return params


def _check_npy(path: Path, kinds: str) -> None:
    """The .npy header alone (a few hundred bytes): a 1-D array of a plain numeric dtype, and a
    file exactly as long as it says, so a missing, truncated or padded file is named here."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            # numpy's own header parser (the header's size is capped); untyped in numpy's stubs.
            version = np.lib.format.read_magic(f)  # type: ignore[no-untyped-call]
            if version not in ((1, 0), (2, 0)):
                raise _invalid(path, f"unsupported .npy format version {version}")
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _fortran, dtype = read(f)  # type: ignore[no-untyped-call]
            offset = f.tell()
    except FileNotFoundError as exc:
        raise _invalid(path, "missing") from exc
    except (OSError, ValueError) as exc:
        raise _invalid(path, f"unreadable .npy header: {exc}") from exc
    if len(shape) != 1 or dtype.kind not in kinds or dtype.hasobject:
        raise _invalid(path, f"holds a {dtype} array of shape {shape}, expected one dimension of kind {kinds!r}")
    if size != offset + shape[0] * dtype.itemsize:
        raise _invalid(path, f"{size} bytes, but its header says {shape[0]} values of {dtype.itemsize} bytes")


def _check_arrays(target: Path, scores: Any, vocab: Any, count: int) -> None:
    """The CSC score matrix (one column per term) and the vocab must index only inside each other
    and the `count` rows, so a query can only add real scores to real rows."""
    if not isinstance(scores, dict) or not isinstance(vocab, dict):
        raise _invalid(target, "scores or vocab did not load as mappings")
    if scores.get("num_docs") != count:
        raise _invalid(target / _PARAMS_FILE, f"num_docs is not the manifest's {count}")
    data = _array(target / _DATA_FILE, scores.get("data"), _ARRAYS[_DATA_FILE])
    indices = _array(target / _INDICES_FILE, scores.get("indices"), _ARRAYS[_INDICES_FILE])
    indptr = _array(target / _INDPTR_FILE, scores.get("indptr"), _ARRAYS[_INDPTR_FILE])
    if data.size != indices.size:
        raise _invalid(target / _DATA_FILE, f"{data.size} scores for {indices.size} row indices")
    if indptr.size == 0 or int(indptr[0]) != 0 or int(indptr[-1]) != indices.size:
        raise _invalid(target / _INDPTR_FILE, f"does not run from 0 to the {indices.size} row indices")
    if bool((indptr[1:] < indptr[:-1]).any()):
        raise _invalid(target / _INDPTR_FILE, "decreases")
    if indices.size and (int(indices.min()) < 0 or int(indices.max()) >= count):
        raise _invalid(target / _INDICES_FILE, f"a row index is out of range (not in 0..{count - 1})")
    if not bool(np.isfinite(data).all()):
        raise _invalid(target / _DATA_FILE, "a score is not finite")
    _check_vocab(target / _VOCAB_FILE, vocab, indptr.size - 1)


def _array(path: Path, array: Any, kinds: str) -> np.ndarray:
    if not isinstance(array, np.ndarray) or array.ndim != 1 or array.dtype.kind not in kinds:
        raise _invalid(path, "not a one-dimensional array of the expected type")
    return array


def _check_vocab(path: Path, vocab: dict[Any, Any], terms: int) -> None:
    """Term ids must be integers naming the matrix's columns, one column per term."""
    values = list(vocab.values())
    try:
        ids = np.asarray(values) if values else np.zeros(0, dtype=np.int64)
    except (ValueError, OverflowError) as exc:
        raise _invalid(path, f"term ids are not integers: {exc}") from exc
    if ids.ndim != 1 or ids.dtype.kind not in "iu":
        raise _invalid(path, "term ids are not integers")
    # bm25s gives the empty token (a query with no known term) the id one past the last column and
    # checks for it before scoring; every other id must name a column.
    empty = vocab.get("")
    placeholder = int(isinstance(empty, int) and empty == terms)
    if len(vocab) != terms + placeholder:
        raise _invalid(path, f"{len(vocab)} terms for a score matrix of {terms} terms")
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) > terms or int((ids == terms).sum()) > placeholder):
        raise _invalid(path, f"a term id is out of range (not in 0..{terms - 1})")


def _invalid(path: Path, reason: str) -> IndexLoadError:
    return IndexLoadError(f"BM25 file {path} is not valid: {reason}")


def bm25_terms(texts: list[str]) -> list[list[str]]:
    """The same analysis as the local index (English stopwords, Snowball stemmer), as term lists."""
    import bm25s

    quiet_bm25s()
    out = bm25s.tokenize(texts, stopwords=STOPWORDS, stemmer=stemmer(), return_ids=False, show_progress=False)
    return [list(terms) for terms in out]
