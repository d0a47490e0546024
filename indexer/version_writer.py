"""Writes a version's files as its rows come, so a build holds a group of chunks at a time, not
the corpus: docstore lines, vectors and document records are appended, BM25's terms spilled,
and the filterable fields' values kept per document (docs/indexing.md, memory). `finish` then
builds the graph and BM25 from those files."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from indexer import host_share
from indexer.chunking import embedding_text
from indexer.metadata import Fields
from indexer.previous import Previous, extend_graph
from ragserve.index.bm25_build import Bm25Builder
from ragserve.index.chunk_store import chunk_record, record_text, relabeled_record
from ragserve.index.format import CHUNKS_FILE, DOCUMENTS_FILE, HNSW_FILE, VECTORS_FILE
from ragserve.index.hnsw_build import build_hnsw
from ragserve.index.metadata import FIELDS_FILE, FieldColumns
from ragserve.index.vector_file import VectorFile, VectorWriter
from ragserve.json_bytes import kept_json
from ragserve.request.sentences import analyse_text
from ragserve.types import Chunk

_BM25_BATCH = 4096  # texts tokenized together (bm25s's tokenizer has a per-call cost)


@dataclass(frozen=True, slots=True)
class DocumentRows:
    """One document of the version: its identity and metadata as this build read them."""

    doc_id: str
    content_hash: str
    meta_hash: str
    metadata: dict[str, Any]


class VersionWriter:
    def __init__(self, build: Path, dim: int, fields: Fields) -> None:
        self.build = build
        self.rows = 0
        self._fields = fields
        self._docstore = (build / CHUNKS_FILE).open("wb")
        self._documents = (build / DOCUMENTS_FILE).open("wb")
        self._vectors = VectorWriter(build / VECTORS_FILE, dim)
        self._bm25 = Bm25Builder(build / "bm25.spill")
        self._bm25_texts: list[str] = []
        # (first row, chunks, metadata) per document, for the columns: a document's chunks share it.
        self._metadata: list[tuple[int, int, dict[str, Any]]] = []
        self.seconds = {"graph": 0.0, "bm25": 0.0}  # where `finish` (and BM25's spill) spent its time

    def add_new(self, doc: DocumentRows, chunks: list[Chunk], vectors: np.ndarray) -> None:
        """A document chunked and embedded in this build (or taken from a checkpoint)."""
        lines, texts = [], []
        for chunk in chunks:
            # Metadata is the document's as read now, also on chunks a checkpoint kept.
            if chunk.metadata != doc.metadata:
                chunk = dataclasses.replace(chunk, metadata=doc.metadata)
            lines.append(chunk_record(chunk, chunk.sentences or analyse_text(chunk.text)))
            texts.append(embedding_text(chunk))
        self._add(doc, lines, texts, vectors)

    def add_kept(self, doc: DocumentRows, lines: list[bytes], vectors: np.ndarray, relabel: bool) -> None:
        """A document unchanged since the previous version: its stored lines, as bytes (with the
        metadata replaced when only that changed)."""
        if relabel:
            lines = [relabeled_record(line, doc.metadata) for line in lines]
        texts = []
        for line in lines:
            title, text = record_text(line)
            texts.append(embedding_text(Chunk("", "", text, title)))
        self._add(doc, lines, texts, vectors)

    def _add(self, doc: DocumentRows, lines: list[bytes], texts: list[str], vectors: np.ndarray) -> None:
        if len(vectors) != len(lines):
            raise ValueError(f"{doc.doc_id}: {len(vectors)} vectors for {len(lines)} chunks")
        record = {"doc_id": doc.doc_id, "hash": doc.content_hash, "first_row": self.rows, "chunks": len(lines)}
        self._documents.write(kept_json({**record, "meta": doc.meta_hash}) + b"\n")
        for line in lines:
            self._docstore.write(line)
            self._docstore.write(b"\n")
        self._vectors.append(vectors)
        if self._fields.schema and lines:
            self._metadata.append((self.rows, len(lines), doc.metadata))
        self.rows += len(lines)
        self._bm25_texts.extend(texts)
        if len(self._bm25_texts) >= _BM25_BATCH:
            started = time.perf_counter()
            self._bm25.add(self._bm25_texts)
            self._bm25_texts = []
            self.seconds["bm25"] += time.perf_counter() - started

    def finish(self, base: Previous | None) -> tuple[list[str], int]:
        """Closes the appended files, then writes the graph (`base`'s extended, or a new one), BM25
        and the columns; returns the file names and the search breadth the graph needs."""
        started = time.perf_counter()
        self._bm25.add(self._bm25_texts)
        self._bm25_texts = []
        for handle in (self._docstore, self._documents):
            handle.close()
        self._vectors.close()
        # The threads the host share allows now (--threads pins them), as the embedder's.
        threads = host_share.wanted_threads() or -1
        graph_started = time.perf_counter()
        with VectorFile(self.build / VECTORS_FILE) as vectors:
            if base is not None:
                ef_search = extend_graph(base, vectors, self.build / HNSW_FILE, threads)
            else:
                ef_search = build_hnsw(vectors, self.build / HNSW_FILE, threads=threads)
        bm25_started = time.perf_counter()
        self.seconds["graph"] = bm25_started - graph_started
        names = [HNSW_FILE, CHUNKS_FILE, VECTORS_FILE, DOCUMENTS_FILE, *self._bm25.finish(self.build)]
        self.seconds["bm25"] += time.perf_counter() - bm25_started + graph_started - started
        if self._fields.schema:
            FieldColumns.of_metadata(self._row_metadata(), self._fields.schema).write(self.build / FIELDS_FILE)
            names.append(FIELDS_FILE)
        return names, ef_search

    def _row_metadata(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for _, count, metadata in self._metadata:
            rows.extend([metadata] * count)
        return rows
