"""A build writes each row as it is made and copies a kept document's rows from the previous
version's files: whatever path a row took (embedded now, kept as stored bytes, relabelled, taken
from a checkpoint), the version holds what a clean build of the same source holds."""

from __future__ import annotations

from pathlib import Path

import bm25s
import numpy as np
import pytest

from indexer.build import build_index
from indexer.chunking import ChunkingConfig
from ragserve.index.bm25 import BM25_DIR
from ragserve.index.format import CHUNKS_FILE, DOCUMENTS_FILE, VECTORS_FILE, resolve_current
from ragserve.index.vector_file import VectorFile, VectorWriter
from tests.indexer.test_resume import SlowEmbedder

CHUNKING = ChunkingConfig(8, 0)


def _write(folder: Path, docs: dict[str, str]) -> Path:
    """Only what differs is written: a file's modification time is metadata too."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*"):
        if old.name not in docs:
            old.unlink()
    for name, text in docs.items():
        if not (folder / name).is_file() or (folder / name).read_text() != text:
            (folder / name).write_text(text)
    return folder


def _docs(n: int, changed: int = -1) -> dict[str, str]:
    return {
        f"doc{d:02d}.md": f"---\nteam: t{d % 3}\n---\n"
        + " ".join(f"w{d}x{i}{'c' if d == changed else ''}" for i in range(20))
        for d in range(n)
    }


def _bm25(folder: Path) -> dict[str, tuple[list[int], list[float]]]:
    loaded = bm25s.BM25.load(str(folder / BM25_DIR), load_corpus=False)
    data, indices, indptr = (loaded.scores[k] for k in ("data", "indices", "indptr"))
    return {
        stem: (indices[indptr[c] : indptr[c + 1]].tolist(), data[indptr[c] : indptr[c + 1]].tolist())
        for stem, c in loaded.vocab_dict.items()
        if c < len(indptr) - 1
    }


def _assert_same_content(root: Path, clean: Path) -> None:
    a, b = resolve_current(root), resolve_current(clean)
    for name in (CHUNKS_FILE, DOCUMENTS_FILE):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    np.testing.assert_array_equal(np.load(a / VECTORS_FILE), np.load(b / VECTORS_FILE))
    assert _bm25(a) == _bm25(b)


def _build(docs: Path, root: Path, incremental: bool = True) -> object:
    return build_index(docs, root, SlowEmbedder(), CHUNKING, progress=False, incremental=incremental, group_chunks=4)


@pytest.mark.parametrize("edit", ["change", "relabel", "remove"])
def test_an_incremental_build_holds_what_a_clean_build_holds(tmp_path: Path, edit: str) -> None:
    docs = _write(tmp_path / "docs", _docs(9))
    root = tmp_path / "idx"
    _build(docs, root)
    after = _docs(9, changed=4 if edit == "change" else -1)
    if edit == "relabel":
        after["doc02.md"] = after["doc02.md"].replace("team: t2", "team: t9")
    if edit == "remove":
        del after["doc05.md"]
    _write(docs, after)
    report = _build(docs, root)
    assert not report.graph_extended
    assert (report.reused, report.relabeled, report.removed) == {
        "change": (8, 0, 0),
        "relabel": (9, 1, 0),
        "remove": (8, 0, 1),
    }[edit]
    _build(docs, tmp_path / "clean", incremental=False)
    _assert_same_content(root, tmp_path / "clean")


def test_a_graph_extension_keeps_the_old_rows_and_adds_the_new(tmp_path: Path) -> None:
    docs = _write(tmp_path / "docs", _docs(6))
    root = tmp_path / "idx"
    _build(docs, root)
    before = (resolve_current(root) / CHUNKS_FILE).read_bytes()
    _write(docs, _docs(8))
    report = _build(docs, root)
    assert report.graph_extended and (report.embedded, report.reused) == (2, 6)
    after = (resolve_current(root) / CHUNKS_FILE).read_bytes()
    assert after.startswith(before) and after.count(b"\n") == 8 * 3


def test_vectors_are_written_and_read_a_slab_at_a_time(tmp_path: Path) -> None:
    rows = np.random.default_rng(0).random((70, 6), dtype=np.float32)
    writer = VectorWriter(tmp_path / "v.npy", 6)
    for start in range(0, 70, 16):
        writer.append(rows[start : start + 16])
    writer.close()
    np.testing.assert_array_equal(np.load(tmp_path / "v.npy"), rows)
    with VectorFile(tmp_path / "v.npy") as vectors:
        assert vectors.shape == (70, 6)
        np.testing.assert_array_equal(vectors[10:40], rows[10:40])
        np.testing.assert_array_equal(vectors[np.array([[3, 69], [0, 5]])], rows[[[3, 69], [0, 5]]])
        assert sum(len(slab) for _, slab in vectors.slabs(rows=32)) == 70
