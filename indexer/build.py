"""Build and publish an index version from one document source.

Two passes: the source is read once into a spill (indexer/scan.py), then each row is written as
it is made (indexer/version_writer.py), so a build holds a group of chunks at a time, not the
corpus (docs/indexing.md, memory).

Incremental: when the published version was built with the same embedder and chunking, documents
whose content hash is unchanged keep their chunks and vectors (copied from its files); only new or
changed documents are embedded, and documents no longer in the source are dropped. HNSW and BM25
are rebuilt over the result (seconds, against minutes of embedding), or the graph extended when
documents were only added.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from indexer.checkpoint import Checkpoints, clear_checkpoints
from indexer.chunking import ChunkingConfig
from indexer.embedding import GROUP_CHUNKS, IndexingEmbedder, RowStream
from indexer.formats import LoadLimits
from indexer.loaders import Skipped
from indexer.previous import Previous, chunking_dict, load_previous
from indexer.progress import EmbedProgress, stage
from indexer.root_lock import index_root_lock
from indexer.scan import Scan, read_spill, scan_source
from indexer.version_writer import VersionWriter
from ragserve.digests import sha256_file
from ragserve.errors import IndexLoadError
from ragserve.index.bm25 import Bm25Index
from ragserve.index.chunk_store import ChunkStore
from ragserve.index.format import (
    CHUNKS_FILE,
    HNSW_FILE,
    VECTORS_FILE,
    Manifest,
    latest_version,
    new_build_dir,
    publish,
    read_verified_manifest,
    resolve_current,
)
from ragserve.index.graph import load_graph
from ragserve.index.hnsw_build import DEFAULT_EF_CONSTRUCTION, DEFAULT_M
from ragserve.index.metadata import FIELDS_FILE, FieldColumns
from ragserve.index.vector_file import VectorFile

_SPILL = "documents.spill"


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
    # Where the time went: read, chunk, embed (beside reading and chunking), graph, bm25, checks.
    stage_seconds: dict[str, float] = field(default_factory=dict)
    embed_seconds: float = 0.0
    chunks_embedded: int = 0  # chunks embedded in this run (not reused, not resumed)

    @property
    def docs_per_second(self) -> float:
        return self.documents / self.seconds if self.seconds else 0.0

    @property
    def chunks_per_second(self) -> float:
        """The embedding's throughput: chunks embedded in this run per second of embedding."""
        return self.chunks_embedded / self.embed_seconds if self.embed_seconds else 0.0


def build_index(
    source: Path,
    out: Path,
    embedder: IndexingEmbedder,
    chunking: ChunkingConfig | None = None,
    batch_size: int = 16,
    progress: bool = True,
    on_skip: Callable[[Skipped], None] | None = None,
    incremental: bool = True,
    embedder_backend: str = "",
    limits: LoadLimits | None = None,
    declared_fields: dict[str, str] | None = None,
    group_chunks: int = GROUP_CHUNKS,
) -> BuildReport:
    """`declared_fields`: filterable fields with their types, as `--field name:type` gives them
    (others are chosen from the values: indexer/metadata.py). `group_chunks`: chunks embedded and
    checkpointed together (indexer/embedding.py). `embedder_backend`: as the manifest records it;
    unset, the embedder's own (a server warns when its questions' backend differs)."""
    embedder_backend = embedder_backend or str(getattr(embedder, "backend", "torch"))
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
    build = new_build_dir(out)
    try:
        with stage(f"reading {source}", progress):
            scan = scan_source(source, build / _SPILL, on_skip, limits, declared_fields or {})
        report.stage_seconds["read"] = time.perf_counter() - started
        report.skipped, report.fields_left_out = scan.skipped, scan.fields_left_out
        previous = load_previous(out, embedder.model_id, chunking) if incremental else None
        todo = _diff_documents(scan, previous, report)
        same_fields = previous is not None and previous.fields == dict(scan.fields.schema)
        if previous is not None and not todo and not report.removed and same_fields and not report.relabeled:
            # Nothing changed: keep serving the published version instead of minting an identical one.
            shutil.rmtree(build, ignore_errors=True)
            return _kept_version(out, previous, scan, report, started)
        base = _graph_to_extend(previous, todo, report, same_fields)
        report.graph_extended = base is not None
        checkpoints = Checkpoints(out, _embedding_settings(embedder, chunking, embedder_backend), embedder.dim)
        job = _RowsJob(scan, previous, base, todo, build, report)
        embedding = _Embedding(embedder, chunking, batch_size, checkpoints, progress, group_chunks)
        names, ef_search = _write_version(job, embedding, progress)
    except BaseException:
        shutil.rmtree(build, ignore_errors=True)
        raise
    fields = dict(scan.fields.schema)
    graph_base = {"identity": base.identity, "rows": base.count} if base is not None and base.count else {}
    del scan, previous, base, todo  # the verifying loads must not sit beside the build's records
    version = latest_version(out) + 1
    manifest = _manifest(version, build, names, report, embedder, chunking, embedder_backend, fields, ef_search)
    manifest = replace(manifest, graph_base=graph_base)
    checking = time.perf_counter()
    with stage(f"publishing version {version} and checking it as a server loads it", progress):
        report.folder = _publish_verified(out, build, manifest)
    report.stage_seconds["checks"] = time.perf_counter() - checking
    clear_checkpoints(out)
    report.version = version
    report.published = True
    report.seconds = time.perf_counter() - started
    return report


@dataclass(frozen=True)
class _RowsJob:
    """What a version's rows come from, and where they go."""

    scan: Scan
    previous: Previous | None
    base: Previous | None  # the previous version, when its graph is extended
    todo: set[str]  # documents to embed
    build: Path
    report: BuildReport


@dataclass(frozen=True)
class _Embedding:
    embedder: IndexingEmbedder
    chunking: ChunkingConfig
    batch_size: int
    checkpoints: Checkpoints
    progress: bool
    group_chunks: int


def _write_version(job: _RowsJob, embedding: _Embedding, progress: bool) -> tuple[list[str], int]:
    """The version's rows, then its graph and BM25: the file names and the graph's search breadth."""
    writer = _write_rows(job, embedding)
    # The graph is the biggest thing a build holds: the documents' records must not sit beside it.
    job.scan.documents.clear()
    job.todo.clear()
    if job.previous is not None:
        job.previous.documents.clear()
    what = "extending the graph" if job.base is not None else "building the graph"
    with stage(f"{what} over {writer.rows:,} chunks, then BM25", progress):
        finished = writer.finish(job.base)
    job.report.stage_seconds.update(writer.seconds)
    return finished


def _write_rows(job: _RowsJob, embedding: _Embedding) -> VersionWriter:
    """Every row into `job.build`, in order: `job.base`'s rows first as they were (its graph is
    extended), then the source's documents in source order, each kept from `job.previous` or
    embedded."""
    scan, previous, base, todo, report = job.scan, job.previous, job.base, job.todo, job.report
    checkpoints = embedding.checkpoints
    resumable = checkpoints.index()
    rows_of = {doc.doc_id: doc for doc in scan.documents}
    resumes = sum(
        1 for doc in scan.documents if doc.doc_id in todo and resumable.get(doc.doc_id, ("",))[0] == doc.content_hash
    )
    to_embed = len(todo) - resumes
    writer = VersionWriter(job.build, embedding.embedder.dim, scan.fields)
    bar = EmbedProgress(to_embed, embedding.progress)
    stream = RowStream(
        writer, embedding.embedder, embedding.chunking, embedding.batch_size, checkpoints, bar, embedding.group_chunks
    )
    try:
        if base is not None:
            for doc_id in base.order():
                lines, vectors = base.rows(doc_id)
                stream.add_kept(rows_of[doc_id], lines, vectors, relabel=False)
        for rows, doc in read_spill(scan.spill, rows_of):
            kept = previous.documents.get(doc.doc_id) if previous is not None else None
            if kept is None or doc.doc_id in todo:
                stream.add_new(rows, doc)
            elif base is None and previous is not None:  # with a base, its rows are written above
                lines, vectors = previous.rows(doc.doc_id)
                stream.add_kept(rows, lines, vectors, relabel=kept.meta_hash != rows.meta_hash)
        stream.finish()
    finally:
        stream.close()
        bar.close()
        if previous is not None:
            previous.close()
    (job.build / _SPILL).unlink()
    report.embed_seconds, report.chunks_embedded = stream.embed_seconds, stream.chunks_embedded
    report.stage_seconds.update(chunk=stream.chunk_seconds, embed=stream.embed_seconds)
    report.resumed = stream.resumed
    report.embedded -= stream.resumed
    report.chunks = writer.rows
    return writer


def _kept_version(out: Path, previous: Previous, scan: Scan, report: BuildReport, started: float) -> BuildReport:
    report.version = latest_version(out)
    report.folder = resolve_current(out)
    report.chunks = sum(previous.documents[d.doc_id].chunks for d in scan.documents)
    clear_checkpoints(out)
    report.seconds = time.perf_counter() - started
    return report


def _graph_to_extend(
    previous: Previous | None, todo: set[str], report: BuildReport, same_fields: bool
) -> Previous | None:
    """The previous version, when this one only adds documents to it (none removed, changed or
    relabelled, same fields): its graph is extended, not rebuilt."""
    if previous is None or not previous.has_graph or report.removed or report.relabeled or not same_fields:
        return None
    if any(doc_id in previous.documents for doc_id in todo):
        return None
    return previous


def _diff_documents(scan: Scan, previous: Previous | None, report: BuildReport) -> set[str]:
    """The documents to embed (new or changed); counts what is new, kept, relabelled and gone."""
    todo: set[str] = set()
    for doc in scan.documents:
        kept = previous.documents.get(doc.doc_id) if previous is not None else None
        if kept is not None and kept.content_hash == doc.content_hash:
            report.relabeled += kept.meta_hash != doc.meta_hash
        else:
            todo.add(doc.doc_id)
    report.reused = len(scan.documents) - len(todo)
    report.embedded = len(todo)
    current_ids = {d.doc_id for d in scan.documents}
    report.removed = len(set(previous.documents) - current_ids) if previous else 0
    report.documents = len(scan.documents)
    return todo


def _embedding_settings(embedder: IndexingEmbedder, chunking: ChunkingConfig, backend: str) -> dict[str, Any]:
    """What a checkpoint's vectors depend on besides each document's text."""
    return {"embedder": embedder.model_id, "backend": backend, "dim": embedder.dim, **chunking_dict(chunking)}


def _manifest(
    version: int,
    build: Path,
    names: list[str],
    report: BuildReport,
    embedder: IndexingEmbedder,
    chunking: ChunkingConfig,
    embedder_backend: str,
    fields: dict[str, str],
    ef_search: int,
) -> Manifest:
    return Manifest(
        version=version,
        embedder_id=embedder.model_id,
        dim=embedder.dim,
        count=report.chunks,
        files={name: sha256_file(build / name) for name in names},
        hnsw={"M": DEFAULT_M, "ef_construction": DEFAULT_EF_CONSTRUCTION, "ef_search": ef_search},
        chunking=chunking_dict(chunking),
        documents=report.documents,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        bm25={"library": "bm25s", "stopwords": "en", "stemmer": "english"},
        embedder_backend=embedder_backend,
        fields=fields,
    )


def _publish_verified(out: Path, build: Path, manifest: Manifest) -> Path:
    """Publishes, then reads what was published the way the server will load it: checksums, the
    graph, BM25, the docstore and the columns, one at a time, so the check never holds more than
    the biggest of them (the graph)."""
    folder = publish(out, build, manifest)
    manifest = read_verified_manifest(folder)
    load_graph(folder / HNSW_FILE, manifest.dim, manifest.count).close()
    with VectorFile(folder / VECTORS_FILE) as vectors:
        if vectors.shape != (manifest.count, manifest.dim):
            raise IndexLoadError(f"index at {folder}: {VECTORS_FILE} has shape {vectors.shape}")
    if manifest.bm25:
        Bm25Index.load(folder, manifest.count)
    ChunkStore(folder / CHUNKS_FILE, manifest.count).close()
    if FIELDS_FILE in manifest.files:
        FieldColumns.read(folder / FIELDS_FILE, manifest.count, manifest.fields)
    return folder
