"""Build and publish an index version from one document source."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from tqdm import tqdm

from indexer.chunking import ChunkingConfig, chunk_document, embedding_text
from indexer.loaders import Document, Skipped, SourceError, iter_source
from ragserve.embedding import SentenceTransformerEmbedder
from ragserve.index.format import (
    CHUNKS_FILE,
    HNSW_FILE,
    Manifest,
    latest_version,
    new_build_dir,
    publish,
    read_verified_manifest,
    sha256_file,
)
from ragserve.index.hnsw import DEFAULT_EF_CONSTRUCTION, DEFAULT_M, HnswIndex, build_hnsw, write_chunks
from ragserve.types import Chunk


@dataclass
class BuildReport:
    version: int = 0
    folder: Path | None = None
    documents: int = 0
    chunks: int = 0
    skipped: list[Skipped] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def docs_per_second(self) -> float:
        return self.documents / self.seconds if self.seconds else 0.0


def build_index(
    source: Path,
    out: Path,
    embedder: SentenceTransformerEmbedder,
    chunking: ChunkingConfig | None = None,
    batch_size: int = 64,
    progress: bool = True,
    on_skip: Callable[[Skipped], None] | None = None,
) -> BuildReport:
    started = time.perf_counter()
    chunking = chunking or ChunkingConfig()
    report = BuildReport()
    documents: list[Document] = []
    for item in iter_source(source):
        if isinstance(item, Skipped):
            report.skipped.append(item)
            if on_skip:
                on_skip(item)
        else:
            documents.append(item)
    if not documents:
        raise SourceError(f"no indexable documents in {source} (.txt and .md files, or a BEIR corpus.jsonl)")

    chunks: list[Chunk] = []
    bar = tqdm(total=len(documents), unit="doc", desc="chunk+embed", disable=not progress)
    # Embed in groups of documents so the bar shows documents/s and a real ETA.
    group = max(1, batch_size // 2)
    vectors: list[np.ndarray] = []
    for i in range(0, len(documents), group):
        batch_chunks = [
            c for doc in documents[i : i + group] for c in chunk_document(doc, embedder.tokenizer, chunking)
        ]
        if batch_chunks:
            vectors.append(embedder.embed_documents([embedding_text(c) for c in batch_chunks], batch_size))
            chunks.extend(batch_chunks)
        bar.update(len(documents[i : i + group]))
    bar.close()
    matrix = np.concatenate(vectors) if vectors else np.zeros((0, embedder.dim), dtype=np.float32)

    version = latest_version(out) + 1
    build = new_build_dir(out)
    build_hnsw(matrix, build / HNSW_FILE)
    write_chunks(build / CHUNKS_FILE, chunks)
    manifest = Manifest(
        version=version,
        embedder_id=embedder.model_id,
        dim=embedder.dim,
        count=len(chunks),
        files={name: sha256_file(build / name) for name in (HNSW_FILE, CHUNKS_FILE)},
        hnsw={"M": DEFAULT_M, "ef_construction": DEFAULT_EF_CONSTRUCTION},
        chunking={"size_tokens": chunking.size_tokens, "overlap_tokens": chunking.overlap_tokens},
        documents=len(documents),
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    folder = publish(out, build, manifest)
    # Verify what was published the way the server will load it.
    read_verified_manifest(folder)
    HnswIndex.load(out)
    report.version = version
    report.folder = folder
    report.documents = len(documents)
    report.chunks = len(chunks)
    report.seconds = time.perf_counter() - started
    return report
