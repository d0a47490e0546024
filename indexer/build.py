"""Build and publish an index version from one document source.

Incremental: when the published version was built with the same embedder and chunking, documents
whose content hash is unchanged keep their chunks and vectors; only new or changed documents are
embedded, and documents no longer in the source are dropped. HNSW and BM25 are rebuilt over the
result (seconds, against minutes of embedding).
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from indexer.checkpoint import Checkpoints, clear_checkpoints
from indexer.chunking import ChunkingConfig, embedding_text
from indexer.embedding import GROUP_CHUNKS, IndexingEmbedder, embed_all
from indexer.loaders import Document, LoadLimits, Skipped, SourceError
from indexer.metadata import Fields, MetadataError, choose_fields, normalized
from indexer.previous import Previous, chunking_dict, extend_graph, load_previous
from indexer.root_lock import index_root_lock
from indexer.sources import iter_source
from ragserve.digests import sha256_file
from ragserve.index.bm25 import build_bm25
from ragserve.index.chunk_store import write_chunks
from ragserve.index.format import (
    CHUNKS_FILE,
    DOCUMENTS_FILE,
    HNSW_FILE,
    VECTORS_FILE,
    Manifest,
    latest_version,
    new_build_dir,
    publish,
    read_verified_manifest,
    resolve_current,
)
from ragserve.index.hnsw import DEFAULT_EF_CONSTRUCTION, DEFAULT_M, HnswIndex, build_hnsw
from ragserve.index.metadata import FIELDS_FILE, FieldColumns
from ragserve.json_bytes import kept_json
from ragserve.request.sentences import analyse_text
from ragserve.types import Chunk


@dataclass
class BuildReport:
    version: int = 0
    folder: Path | None = None
    published: bool = False
    documents: int = 0
    embedded: int = 0  # documents (re-)embedded in this run
    resumed: int = 0  # new or changed documents whose vectors came from an interrupted build's checkpoints
    reused: int = 0  # unchanged documents whose vectors were kept
    removed: int = 0  # documents of the previous version no longer in the source
    relabeled: int = 0  # unchanged text, changed metadata: kept vectors, new metadata
    graph_extended: bool = False  # documents only added: the previous HNSW graph was extended
    # Metadata fields left out of filters, with why (mixed types, objects).
    fields_left_out: dict[str, str] = field(default_factory=dict)
    chunks: int = 0
    skipped: list[Skipped] = field(default_factory=list)
    seconds: float = 0.0
    embed_seconds: float = 0.0
    chunks_embedded: int = 0  # chunks embedded in this run (not reused, not resumed)

    @property
    def docs_per_second(self) -> float:
        return self.documents / self.seconds if self.seconds else 0.0

    @property
    def chunks_per_second(self) -> float:
        """The embedding's throughput: chunks embedded in this run per second of embedding."""
        return self.chunks_embedded / self.embed_seconds if self.embed_seconds else 0.0


def load_documents(
    source: Path,
    report: BuildReport,
    on_skip: Callable[[Skipped], None] | None,
    limits: LoadLimits | None = None,
) -> list[Document]:
    documents: list[Document] = []
    seen: set[str] = set()
    for item in iter_source(source, limits):
        if isinstance(item, Document) and item.doc_id in seen:
            item = Skipped(item.source, f"duplicate document id {item.doc_id!r}")
        if isinstance(item, Skipped):
            report.skipped.append(item)
            if on_skip:
                on_skip(item)
            continue
        seen.add(item.doc_id)
        documents.append(item)
    if not documents:
        raise SourceError(
            f"no indexable documents in {source} (.txt, .md, .html and .pdf files, or a BEIR corpus.jsonl)"
        )
    return documents


def build_index(
    source: Path,
    out: Path,
    embedder: IndexingEmbedder,
    chunking: ChunkingConfig | None = None,
    batch_size: int = 16,
    progress: bool = True,
    on_skip: Callable[[Skipped], None] | None = None,
    incremental: bool = True,
    embedder_backend: str = "torch",
    limits: LoadLimits | None = None,
    declared_fields: dict[str, str] | None = None,
    group_chunks: int = GROUP_CHUNKS,
) -> BuildReport:
    """`declared_fields`: filterable fields with their types, as `--field name:type` gives them
    (others are chosen from the values: indexer/metadata.py). `group_chunks`: chunks embedded and
    checkpointed together (indexer/embedding.py)."""
    with index_root_lock(out):
        return _build_locked(
            source,
            out,
            embedder,
            chunking,
            batch_size,
            progress,
            on_skip,
            incremental,
            embedder_backend,
            limits,
            declared_fields,
            group_chunks,
        )


def _build_locked(
    source: Path,
    out: Path,
    embedder: IndexingEmbedder,
    chunking: ChunkingConfig | None,
    batch_size: int,
    progress: bool,
    on_skip: Callable[[Skipped], None] | None,
    incremental: bool,
    embedder_backend: str,
    limits: LoadLimits | None,
    declared_fields: dict[str, str] | None,
    group_chunks: int,
) -> BuildReport:
    started = time.perf_counter()
    chunking = chunking or ChunkingConfig()
    report = BuildReport()
    documents = load_documents(source, report, on_skip, limits)
    documents, fields = _checked_metadata(documents, declared_fields or {}, report, on_skip)
    previous = load_previous(out, embedder.model_id, chunking) if incremental else None
    work = _diff_documents(documents, previous, report)

    unchanged_fields = previous is not None and previous.fields == dict(fields.schema)
    if previous is not None and not work.todo and not report.removed and unchanged_fields and not report.relabeled:
        # Nothing changed: keep serving the published version instead of minting an identical one.
        report.version = latest_version(out)
        report.folder = resolve_current(out)
        report.chunks = sum(len(c) for c in work.chunks.values())
        report.seconds = time.perf_counter() - started
        clear_checkpoints(out)
        return report

    embed_started = time.perf_counter()
    checkpoints = Checkpoints(out, _embedding_settings(embedder, chunking, embedder_backend), embedder.dim)
    outcome = embed_all(work.todo, embedder, chunking, batch_size, checkpoints, progress, group_chunks)
    for doc_id, item in outcome.embedded.items():
        work.chunks[doc_id], work.vectors[doc_id] = item.chunks, item.vectors
    outcome.embedded.clear()  # moved: `_assemble` frees each document's vectors as it copies them
    report.embed_seconds = time.perf_counter() - embed_started
    report.resumed, report.chunks_embedded = outcome.resumed, outcome.chunks_embedded
    report.embedded -= outcome.resumed

    base = _graph_to_extend(previous, work, report, unchanged_fields)
    report.graph_extended = base is not None
    content = _assemble(_row_order(documents, base), work, embedder.dim)
    version = latest_version(out) + 1
    build = new_build_dir(out)
    names, ef_search = _write_index_files(build, content, base, previous.sentences if previous else {}, fields)
    report.chunks = len(content.chunks)
    manifest = _manifest(version, build, names, report.chunks, embedder, chunking, len(documents), embedder_backend)
    del content, work, documents, base, previous  # the verifying load must not sit beside the build's rows
    hnsw = {**manifest.hnsw, "ef_search": ef_search}
    manifest = dataclasses.replace(manifest, fields=dict(fields.schema), hnsw=hnsw)
    report.folder = _publish_verified(out, build, manifest)
    clear_checkpoints(out)
    report.version = version
    report.published = True
    report.seconds = time.perf_counter() - started
    return report


def _graph_to_extend(previous: Previous | None, work: _Work, report: BuildReport, same_fields: bool) -> Previous | None:
    """The previous version, when this one only adds documents to it (none removed, changed or
    relabelled, same fields): its graph is extended, not rebuilt."""
    if previous is None or previous.folder is None or report.removed or report.relabeled or not same_fields:
        return None
    if any(doc.doc_id in previous.hashes for doc in work.todo):
        return None
    return previous


def _row_order(documents: list[Document], base: Previous | None) -> list[Document]:
    """Source order; or, extending a graph, the previous version's rows first, as they were."""
    if base is None:
        return documents
    by_id = {doc.doc_id: doc for doc in documents}
    kept = set(base.order)
    return [by_id[doc_id] for doc_id in base.order] + [doc for doc in documents if doc.doc_id not in kept]


def metadata_hash(doc: Document) -> str:
    return hashlib.sha256(orjson.dumps(doc.metadata, option=orjson.OPT_SORT_KEYS)).hexdigest()[:32]


def _checked_metadata(
    documents: list[Document],
    declared: dict[str, str],
    report: BuildReport,
    on_skip: Callable[[Skipped], None] | None,
) -> tuple[list[Document], Fields]:
    """The version's filterable fields, and each document with only their values, as stored. A
    document whose value does not fit is reported and skipped, whole."""
    fields = choose_fields([d.metadata for d in documents], declared)
    report.fields_left_out = fields.left_out
    kept: list[Document] = []
    for doc in documents:
        try:
            kept.append(dataclasses.replace(doc, metadata=normalized(doc.metadata, fields.schema)))
        except MetadataError as exc:
            skipped = Skipped(doc.source, str(exc))
            report.skipped.append(skipped)
            if on_skip:
                on_skip(skipped)
    if not kept:
        raise SourceError("no document's metadata fits the declared fields (each was reported)")
    return kept, fields


@dataclass
class _Work:
    """Each document's chunks and vectors, kept from the previous version or made in this run."""

    todo: list[Document]  # new or changed: to chunk and embed
    chunks: dict[str, list[Chunk]] = field(default_factory=dict)
    vectors: dict[str, np.ndarray] = field(default_factory=dict)


def _diff_documents(documents: list[Document], previous: Previous | None, report: BuildReport) -> _Work:
    """Keep unchanged documents' chunks and vectors; count what is new, kept and gone."""
    work = _Work(todo=[])
    for doc in documents:
        if previous is not None and previous.hashes.get(doc.doc_id) == doc.content_hash:
            work.chunks[doc.doc_id] = previous.chunks[doc.doc_id]
            work.vectors[doc.doc_id] = previous.vectors[doc.doc_id]
            report.relabeled += previous.meta_hashes.get(doc.doc_id) != metadata_hash(doc)
        else:
            work.todo.append(doc)
    report.reused = len(documents) - len(work.todo)
    report.embedded = len(work.todo)
    current_ids = {d.doc_id for d in documents}
    report.removed = len(set(previous.hashes) - current_ids) if previous else 0
    report.documents = len(documents)
    return work


def _embedding_settings(embedder: IndexingEmbedder, chunking: ChunkingConfig, backend: str) -> dict[str, Any]:
    """What a checkpoint's vectors depend on besides each document's text."""
    return {"embedder": embedder.model_id, "backend": backend, "dim": embedder.dim, **chunking_dict(chunking)}


@dataclass(frozen=True)
class _Content:
    """The version's rows (`_row_order`): chunks, their vectors, and one record per document."""

    chunks: list[Chunk]
    matrix: np.ndarray
    records: list[bytes]


def _assemble(documents: list[Document], work: _Work, dim: int) -> _Content:
    """Moves `work`'s chunks and vectors into the version's rows: each document's are dropped from
    `work` as they are copied, so a big corpus is not held twice (docs/indexing.md, memory)."""
    count = sum(len(work.chunks[doc.doc_id]) for doc in documents)
    matrix = np.empty((count, dim), dtype=np.float32)
    chunks: list[Chunk] = []
    records: list[bytes] = []
    for doc in documents:
        # Metadata is the document's as read now, also on chunks kept from the previous version.
        cs = [
            c if c.metadata == doc.metadata else dataclasses.replace(c, metadata=doc.metadata)
            for c in work.chunks.pop(doc.doc_id)
        ]
        record = {"doc_id": doc.doc_id, "hash": doc.content_hash, "first_row": len(chunks), "chunks": len(cs)}
        records.append(kept_json({**record, "meta": metadata_hash(doc)}))  # one per document: held to the end
        matrix[len(chunks) : len(chunks) + len(cs)] = work.vectors.pop(doc.doc_id)
        chunks.extend(cs)
    return _Content(chunks, matrix, records)


def _write_index_files(
    build: Path, content: _Content, base: Previous | None, stored: dict[str, bytes], fields: Fields
) -> tuple[list[str], int]:
    """HNSW graph (`base`'s extended, or a new one), chunks (with their sentences: `stored` for a
    kept chunk's text, else analysed), vectors, document records, BM25 and the filterable fields'
    columns into `build`; returns the file names and the search breadth the graph needs."""
    if base is not None:
        ef_search = extend_graph(base, content.matrix, build / HNSW_FILE)
    else:
        ef_search = build_hnsw(content.matrix, build / HNSW_FILE)
    write_chunks(build / CHUNKS_FILE, content.chunks, analyse_text, stored)
    np.save(build / VECTORS_FILE, content.matrix, allow_pickle=False)
    (build / DOCUMENTS_FILE).write_bytes(b"\n".join(content.records) + b"\n")
    bm25_files = build_bm25([embedding_text(c) for c in content.chunks], build)
    names = [HNSW_FILE, CHUNKS_FILE, VECTORS_FILE, DOCUMENTS_FILE, *bm25_files]
    if fields.schema:
        FieldColumns(content.chunks, fields.schema).write(build / FIELDS_FILE)
        names.append(FIELDS_FILE)
    return names, ef_search


def _manifest(
    version: int,
    build: Path,
    names: list[str],
    count: int,
    embedder: IndexingEmbedder,
    chunking: ChunkingConfig,
    documents: int,
    embedder_backend: str,
) -> Manifest:
    return Manifest(
        version=version,
        embedder_id=embedder.model_id,
        dim=embedder.dim,
        count=count,
        files={name: sha256_file(build / name) for name in names},
        hnsw={"M": DEFAULT_M, "ef_construction": DEFAULT_EF_CONSTRUCTION},
        chunking=chunking_dict(chunking),
        documents=documents,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        bm25={"library": "bm25s", "stopwords": "en", "stemmer": "english"},
        embedder_backend=embedder_backend,
    )


def _publish_verified(out: Path, build: Path, manifest: Manifest) -> Path:
    folder = publish(out, build, manifest)
    # Verify what was published the way the server will load it.
    read_verified_manifest(folder)
    HnswIndex.load(out)
    return folder
