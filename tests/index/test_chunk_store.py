"""The docstore as served: mapped and decoded a row at a time, with each chunk's sentences stored
at build time (index format 2); format 1 versions still load, a newer format is refused by name."""

from __future__ import annotations

import gc
import json
import os
from pathlib import Path

import pytest

from ragserve.errors import IndexLoadError
from ragserve.index.chunk_store import ChunkStore, read_chunks, write_chunks
from ragserve.index.format import CHUNKS_FILE, FORMAT_VERSION, MANIFEST, Manifest, resolve_current
from ragserve.index.hnsw import HnswIndex
from ragserve.request.sentences import analyse_text
from ragserve.source_location import SourceLocation
from ragserve.types import Chunk

TEXTS = [
    "Bloom filters answer membership queries. They never give false negatives.",
    "A B-tree keeps keys sorted. Dr. Bayer and Dr. McCreight described it in 1970.",
    "Plain text with no stop at the end",
]


def _chunks() -> list[Chunk]:
    return [Chunk(f"c{i}", f"d{i}", text, metadata={"n": i}) for i, text in enumerate(TEXTS)]


def test_rows_decode_to_the_chunks_written_with_their_sentences(tmp_path: Path) -> None:
    path = tmp_path / CHUNKS_FILE
    write_chunks(path, _chunks(), analyse_text)
    store = ChunkStore(path, len(TEXTS))
    assert list(store) == _chunks() == read_chunks(path) and store[-1] == _chunks()[-1]
    assert [c.sentences for c in store] == [analyse_text(t) for t in TEXTS]
    assert store[1:3] == _chunks()[1:3]
    with pytest.raises(IndexError):
        store[len(TEXTS)]


def test_rows_are_read_not_mapped_and_at_random(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A mapped docstore's pages stay in the server's RSS as requests touch rows (and the pages the
    kernel maps in around each): the store reads each row with one pread instead."""
    from ragserve.index import chunk_store

    advised: list[int] = []
    real = chunk_store._advise_random
    monkeypatch.setattr(chunk_store, "_advise_random", lambda fd: advised.append(fd) or real(fd))
    path = tmp_path / CHUNKS_FILE
    write_chunks(path, _chunks(), analyse_text)
    store = ChunkStore(path, len(TEXTS))
    assert [store[row] for row in (2, 0, 1)] == [_chunks()[2], _chunks()[0], _chunks()[1]]
    assert str(path) not in Path("/proc/self/maps").read_text()
    assert len(advised) == 1


def test_a_docstore_cut_short_under_the_server_is_an_error_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / CHUNKS_FILE
    write_chunks(path, _chunks(), analyse_text)
    store = ChunkStore(path, len(TEXTS))
    with path.open("r+b") as handle:  # never do this to a published version: docs/indexing.md
        handle.truncate(path.stat().st_size // 2)
    with pytest.raises(IndexLoadError, match="cut short"):
        store[len(TEXTS) - 1]


def test_a_closed_store_says_so_and_a_dropped_one_lets_go_of_its_file(tmp_path: Path) -> None:
    path = tmp_path / CHUNKS_FILE
    write_chunks(path, _chunks(), analyse_text)
    opened = len(os.listdir("/proc/self/fd"))
    store = ChunkStore(path, len(TEXTS))
    store.close()
    with pytest.raises(IndexLoadError, match="closed"):
        store[0]
    ChunkStore(path, len(TEXTS))[0]  # dropped at once
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) == opened


def test_a_docstore_without_sentences_is_analysed_on_demand(tmp_path: Path) -> None:
    path = tmp_path / CHUNKS_FILE
    write_chunks(path, _chunks())  # as format 1 wrote them
    assert all(c.sentences is None for c in ChunkStore(path, len(TEXTS)))


def test_counts_and_records_are_checked(tmp_path: Path) -> None:
    path = tmp_path / CHUNKS_FILE
    write_chunks(path, _chunks(), analyse_text)
    with pytest.raises(IndexLoadError, match="docstore has 3 chunks, manifest says 4"):
        ChunkStore(path, 4)
    lines = path.read_bytes().splitlines(keepends=True)
    bad = json.loads(lines[1])
    bad["sentences"] = [[30, 2, "x"]]  # a span that ends before it starts
    path.write_bytes(lines[0] + json.dumps(bad).encode() + b"\n" + lines[2] + b"{not json")
    store = ChunkStore(path, 4)  # the last line has no newline: still a row
    assert store[0] == _chunks()[0]
    for row in (1, 3):
        with pytest.raises(IndexLoadError, match=f"{CHUNKS_FILE}:{row + 1}: bad docstore record"):
            store[row]


def test_format_1_loads_and_a_newer_format_is_refused_by_name(sample_index: Path) -> None:
    folder = resolve_current(sample_index)
    data = json.loads((folder / MANIFEST).read_text())
    assert data["format"] == FORMAT_VERSION == 3 and data["hnsw"]["ef_search"] >= 0
    assert Manifest.from_json(json.dumps({**data, "format": 1})).format == 1
    assert Manifest.from_json(json.dumps({**data, "format": 2})).format == 2
    with pytest.raises(ValueError, match="unsupported index format 4: this server reads formats 1, 2, 3"):
        Manifest.from_json(json.dumps({**data, "format": 4}))
    index = HnswIndex.load(sample_index)
    assert all(c.sentences is not None for c in index.chunks)
    assert all(c.location is not None and c.location.locator == c.doc_id for c in index.chunks)


def test_a_location_with_pages_inside_its_chunk_survives_the_docstore_and_bad_ones_are_refused(
    tmp_path: Path,
) -> None:
    path = tmp_path / CHUNKS_FILE
    where = SourceLocation("paper.pdf", 2, 40, ("Methods",), ((3, 90), (4, 130)))
    located = Chunk("c0", "paper.pdf", "x" * 100, start=50, end=150, location=where)
    write_chunks(path, [located, *_chunks()[1:]], analyse_text)
    assert ChunkStore(path, 3)[0].location == where
    assert [where.at(n).page for n in (50, 89, 90, 129, 130, 149)] == [2, 2, 3, 3, 4, 4]
    lines = path.read_bytes().splitlines(keepends=True)
    for bad in ([[3]], [[3, -1]], [[3, True]], "3,90", [["3", 90]]):
        record = json.loads(lines[0])
        record["location"]["page_breaks"] = bad
        path.write_bytes(json.dumps(record).encode() + b"\n" + b"".join(lines[1:]))
        with pytest.raises(IndexLoadError, match="page_breaks"):
            ChunkStore(path, 3)[0]
