"""Hostile BM25 folders: a params file that picks bm25s' numba scorer (no bounds checks) or keys
bm25s does not know, a score matrix or vocab whose ids lead outside the arrays, damaged files.
Each is refused with an IndexLoadError naming the file, like a crafted hnsw.bin; an untouched
folder loads and answers queries."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ragserve.errors import IndexLoadError
from ragserve.index.bm25 import BM25_DIR, Bm25Index
from ragserve.index.bm25_build import build_bm25
from ragserve.index.format import resolve_current
from ragserve.index.hnsw import HnswIndex
from ragserve.index.reload import FolderWatch, IndexReloader
from tests.fakes import FakeClock, FakeServing
from tests.index.tiny import publish_tiny, refresh_checksum

TEXTS = [f"passage {i} about topic{i % 7} and keyword{i}" for i in range(32)]
COUNT = len(TEXTS)
FAR = 1_000_000  # far past the end of any array here

PARAMS = "params.index.json"
VOCAB = "vocab.index.json"
DATA = "data.csc.index.npy"
INDICES = "indices.csc.index.npy"
INDPTR = "indptr.csc.index.npy"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    build_bm25(TEXTS, tmp_path)
    return tmp_path


def _edit_json(path: Path, change: Callable[[Any], object]) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _edit_array(path: Path, change: Callable[[np.ndarray], object]) -> None:
    array = np.load(path)
    change(array)
    np.save(path, array, allow_pickle=False)


def numba_backend(bm25: Path) -> str:
    _edit_json(bm25 / PARAMS, lambda p: p.__setitem__("backend", "numba"))
    return PARAMS


def auto_backend(bm25: Path) -> str:
    _edit_json(bm25 / PARAMS, lambda p: p.__setitem__("backend", "auto"))
    return PARAMS


def unknown_param(bm25: Path) -> str:
    _edit_json(bm25 / PARAMS, lambda p: p.__setitem__("exec", "rm -rf /"))  # a TypeError in bm25s
    return PARAMS


def constructor_only_param(bm25: Path) -> str:
    # BM25() takes `corpus`, but bm25s never writes it: it would be loaded as is.
    _edit_json(bm25 / PARAMS, lambda p: p.__setitem__("corpus", ["x"]))
    return PARAMS


def object_dtype(bm25: Path) -> str:
    _edit_json(bm25 / PARAMS, lambda p: p.__setitem__("dtype", "object"))
    return PARAMS


def params_not_json(bm25: Path) -> str:
    (bm25 / PARAMS).write_text("{not json")
    return PARAMS


def indptr_not_monotone(bm25: Path) -> str:
    def swap(indptr: np.ndarray) -> None:
        # A column whose end is before its start (keeps the first 0 and the last total).
        indptr[1], indptr[2] = indptr[2] + 3, indptr[1]

    _edit_array(bm25 / INDPTR, swap)
    return INDPTR


def indptr_past_the_end(bm25: Path) -> str:
    _edit_array(bm25 / INDPTR, lambda a: a.__setitem__(-1, FAR))
    return INDPTR


def row_index_out_of_range(bm25: Path) -> str:
    _edit_array(bm25 / INDICES, lambda a: a.__setitem__(0, FAR))
    return INDICES


def negative_row_index(bm25: Path) -> str:
    _edit_array(bm25 / INDICES, lambda a: a.__setitem__(0, -1))
    return INDICES


def score_not_finite(bm25: Path) -> str:
    _edit_array(bm25 / DATA, lambda a: a.__setitem__(0, np.nan))
    return DATA


def vocab_id_out_of_range(bm25: Path) -> str:
    _edit_json(bm25 / VOCAB, lambda v: v.__setitem__(next(k for k in v if k), FAR))
    return VOCAB


def vocab_id_not_an_int(bm25: Path) -> str:
    _edit_json(bm25 / VOCAB, lambda v: v.__setitem__(next(k for k in v if k), "0"))
    return VOCAB


def truncated_array(bm25: Path) -> str:
    path = bm25 / INDICES
    path.write_bytes(path.read_bytes()[:-8])
    return INDICES


def empty_array_file(bm25: Path) -> str:
    (bm25 / INDPTR).write_bytes(b"")
    return INDPTR


def missing_vocab(bm25: Path) -> str:
    (bm25 / VOCAB).unlink()
    return VOCAB


def two_dimensional_scores(bm25: Path) -> str:
    data = np.load(bm25 / DATA)
    np.save(bm25 / DATA, np.stack([data, data]), allow_pickle=False)
    return DATA


HOSTILE = [
    numba_backend,
    auto_backend,
    unknown_param,
    constructor_only_param,
    object_dtype,
    params_not_json,
    indptr_not_monotone,
    indptr_past_the_end,
    row_index_out_of_range,
    negative_row_index,
    score_not_finite,
    vocab_id_out_of_range,
    vocab_id_not_an_int,
    truncated_array,
    empty_array_file,
    missing_vocab,
    two_dimensional_scores,
]


@pytest.mark.parametrize("tamper", HOSTILE, ids=[t.__name__ for t in HOSTILE])
def test_hostile_bm25_folder_is_refused(folder: Path, tamper: Callable[[Path], str]) -> None:
    name = tamper(folder / BM25_DIR)
    with pytest.raises(IndexLoadError) as refused:
        Bm25Index.load(folder, COUNT)
    assert name in str(refused.value)


def test_untouched_folder_loads_and_answers(folder: Path) -> None:
    index = Bm25Index.load(folder, COUNT)
    rows = index.search("keyword5 topic3", k=5)
    assert rows, "a query with indexed terms finds rows"
    assert rows[0][0] == 5  # the only passage with keyword5
    assert all(0 <= row < COUNT and score > 0.0 for row, score in rows)
    assert [score for _, score in rows] == sorted((score for _, score in rows), reverse=True)
    assert index.search("the and of", k=5) == []  # stopwords only: no terms, no rows
    assert index.search("unindexedword", k=5) == []


def test_count_mismatch_is_refused(folder: Path) -> None:
    with pytest.raises(IndexLoadError, match="manifest says"):
        Bm25Index.load(folder, COUNT + 1)


@pytest.mark.parametrize("tamper", [numba_backend, unknown_param, row_index_out_of_range], ids=lambda t: t.__name__)
def test_hot_reload_refuses_a_hostile_bm25_once_and_keeps_serving(
    tmp_path: Path, tamper: Callable[[Path], str], caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "idx"
    publish_tiny(root, TEXTS, bm25=True)
    holder = FakeServing(HnswIndex.load(root))
    clock = FakeClock(0.0)
    reloader = IndexReloader(FolderWatch(root), holder, clock=clock)
    publish_tiny(root, TEXTS, seed=1, bm25=True)
    name = tamper(resolve_current(root) / BM25_DIR)
    refresh_checksum(root, f"{BM25_DIR}/{name}")  # the manifest vouches for the crafted file
    caplog.set_level(logging.INFO, logger="ragserve.index.reload")
    for _ in range(5):  # refused, not retried (and re-hashed) until something else is published
        assert reloader.check_once() is False
        clock.advance(120.0)
    assert reloader.refused == 1 and reloader.reloads == 0 and holder.index.version == "1"
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(errors) == 1 and name in errors[0].getMessage() and errors[0].exc_info is None
