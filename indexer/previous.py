"""What an incremental build reuses from the published version, read from its files as needed:
each unchanged document's docstore lines (copied as bytes, not decoded) and vectors, and, when
the new version only adds documents, the HNSW graph itself (extended with the new vectors instead
of rebuilt: a 1% addition to a large corpus costs 1% of a graph build).

Only the document records are held (a few hundred bytes a document); the docstore and the vectors
are read a document at a time with plain reads, never loaded or mapped whole (docs/indexing.md,
memory)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hnswlib
import numpy as np
import orjson

from indexer.chunking import ChunkingConfig
from ragserve.errors import IndexLoadError
from ragserve.index.chunk_store import file_line_ends
from ragserve.index.format import (
    CHUNKS_FILE,
    DOCUMENTS_FILE,
    FORMAT_VERSION,
    HNSW_FILE,
    VECTORS_FILE,
    read_verified_version,
    resolve_current,
)
from ragserve.index.hnsw_build import measure_ef
from ragserve.index.hnsw_file import check_hnsw_file
from ragserve.index.vector_file import VectorFile


@dataclass(frozen=True, slots=True)
class PreviousDocument:
    content_hash: str
    meta_hash: str  # a metadata-only change republishes without re-embedding
    first_row: int
    chunks: int


@dataclass
class Previous:
    """The published version an incremental build reads from."""

    folder: Path
    documents: dict[str, PreviousDocument]
    fields: dict[str, str] = field(default_factory=dict)
    count: int = 0
    dim: int = 0
    has_graph: bool = False
    identity: str = ""  # its manifest's (what a server serving it knows it by)
    _line_starts: np.ndarray | None = None
    _line_ends: np.ndarray | None = None
    _docstore: int | None = None
    _vectors: VectorFile | None = None

    def order(self) -> list[str]:
        """The version's documents in row order."""
        return sorted(self.documents, key=lambda doc_id: self.documents[doc_id].first_row)

    def rows(self, doc_id: str) -> tuple[list[bytes], np.ndarray]:
        """A document's docstore lines (without newlines) and vectors, as stored."""
        doc = self.documents[doc_id]
        if self._docstore is None:
            self._open()
        assert self._docstore is not None and self._vectors is not None
        assert self._line_starts is not None and self._line_ends is not None
        if not doc.chunks:
            return [], np.zeros((0, self.dim), dtype=np.float32)
        first, last = doc.first_row, doc.first_row + doc.chunks - 1
        start, end = int(self._line_starts[first]), int(self._line_ends[last])
        data = os.pread(self._docstore, end - start, start)
        lines = data.split(b"\n")
        if len(lines) != doc.chunks or len(data) != end - start:
            raise IndexLoadError(f"index at {self.folder}: the docstore does not hold {doc_id}'s rows")
        return lines, self._vectors.read(first, last + 1)

    def _open(self) -> None:
        ends = file_line_ends(self.folder / CHUNKS_FILE)
        if len(ends) != self.count:
            raise IndexLoadError(f"index at {self.folder}: docstore has {len(ends)} chunks, manifest says {self.count}")
        self._line_ends = ends
        self._line_starts = np.concatenate([[0], ends[:-1] + 1]).astype(np.int64) if len(ends) else ends
        self._docstore = os.open(self.folder / CHUNKS_FILE, os.O_RDONLY)
        self._vectors = VectorFile(self.folder / VECTORS_FILE)
        if self._vectors.shape != (self.count, self.dim):
            raise IndexLoadError(f"index at {self.folder}: {VECTORS_FILE} has shape {self._vectors.shape}")

    def close(self) -> None:
        """Lets go of the files and the line offsets (the records stay)."""
        if self._docstore is not None:
            os.close(self._docstore)
        if self._vectors is not None:
            self._vectors.close()
        self._docstore, self._vectors, self._line_starts, self._line_ends = None, None, None, None


def load_previous(out: Path, embedder_id: str, chunking: ChunkingConfig) -> Previous | None:
    try:
        folder = resolve_current(out)
        manifest, identity = read_verified_version(folder)
    except IndexLoadError:
        return None  # nothing published, or corrupt: build from scratch
    same_settings = manifest.embedder_id == embedder_id and manifest.chunking == chunking_dict(chunking)
    # Rows of an older format have no location in their source: every document is chunked anew.
    same_settings = same_settings and manifest.format >= FORMAT_VERSION
    if not same_settings or VECTORS_FILE not in manifest.files or DOCUMENTS_FILE not in manifest.files:
        return None
    documents: dict[str, PreviousDocument] = {}
    with (folder / DOCUMENTS_FILE).open("rb") as handle:
        for line in handle:
            rec = orjson.loads(line)
            documents[rec["doc_id"]] = PreviousDocument(
                rec["hash"], str(rec.get("meta", "")), int(rec["first_row"]), int(rec["chunks"])
            )
    has_graph = HNSW_FILE in manifest.files
    return Previous(folder, documents, dict(manifest.fields), manifest.count, manifest.dim, has_graph, identity)


def chunking_dict(chunking: ChunkingConfig) -> dict[str, Any]:
    return {"size_tokens": chunking.size_tokens, "overlap_tokens": chunking.overlap_tokens}


def extend_graph(previous: Previous, vectors: VectorFile, path: Path, threads: int = -1) -> int:
    """The previous version's graph with rows previous.count.. of `vectors` added (rows before that
    are the previous version's, unchanged) on `threads` (-1: every CPU), saved to `path`; returns
    the breadth it needs."""
    source = previous.folder / HNSW_FILE
    check_hnsw_file(source, previous.count, previous.dim)  # hnswlib trusts its file
    index = hnswlib.Index(space="ip", dim=previous.dim)
    index.load_index(str(source), max_elements=max(1, len(vectors)))
    for first, slab in vectors.slabs(start=previous.count):
        index.add_items(slab, np.arange(first, first + len(slab)), num_threads=threads)
    index.save_index(str(path))
    return measure_ef(index, vectors)
