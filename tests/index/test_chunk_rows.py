"""Chunks by id (what warming asks for after a reload): found through the indexer's document
records, without decoding every chunk; records that do not hold fall back to the chunks themselves."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson

from ragserve.index.format import DOCUMENTS_FILE, resolve_current
from ragserve.index.hnsw import HnswIndex
from tests.index.tiny import publish_tiny, refresh_checksum


def _some_ids(index: HnswIndex) -> list[str]:
    return [index.chunks[row].chunk_id for row in (0, index.count // 2, index.count - 1)]


def test_chunks_are_found_by_id_from_the_document_records(sample_index: Path) -> None:
    index = HnswIndex.load(sample_index)
    wanted = _some_ids(index)
    found = index.chunks_by_id([*wanted, "no-such-document#0"])
    assert [c.chunk_id for c in found] == wanted
    assert len(index._chunk_rows._rows or {}) == index.count and not index._chunk_rows._decoded


def test_records_that_do_not_hold_fall_back_to_the_chunks(sample_index: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    shutil.copytree(sample_index, root, symlinks=True)
    records = resolve_current(root) / DOCUMENTS_FILE
    lines = records.read_bytes().splitlines()
    first = orjson.loads(lines[0])
    lines[0] = orjson.dumps({**first, "first_row": first["first_row"] + 1})  # rows shifted by one
    records.write_bytes(b"\n".join(lines) + b"\n")
    refresh_checksum(root, DOCUMENTS_FILE)
    index = HnswIndex.load(root)
    wanted = _some_ids(index)
    assert [c.chunk_id for c in index.chunks_by_id(wanted)] == wanted


def test_a_version_without_records_decodes_its_chunks(tmp_path: Path) -> None:
    publish_tiny(tmp_path, ["alpha", "beta", "gamma"])
    index = HnswIndex.load(tmp_path)
    assert [c.chunk_id for c in index.chunks_by_id(["c2", "c0", "zz"])] == ["c2", "c0"]
