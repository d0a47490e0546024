"""Chunk and embed a build's new or changed documents, in groups of about GROUP_CHUNKS chunks:
each group is one call to the embedder (which sorts its chunks by token count, so a batch pads
little) and one checkpoint (indexer/checkpoint.py) as soon as it is done; then its rows are
written (indexer/version_writer.py). A group is embedded on a thread of its own while the next
one is read and chunked, so the cores never wait for the reading (at most three groups held)."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from indexer import host_share
from indexer.checkpoint import Checkpoints, Embedded
from indexer.chunking import CALL_CHARS, Chunker, ChunkingConfig, embedding_text
from indexer.loaders import Document
from indexer.progress import EmbedProgress
from indexer.version_writer import DocumentRows, VersionWriter
from ragserve.types import Chunk

# Chunks per group. Length-sorted batches over a thousand chunks pad under 1% on SciFact (256:
# about 3%); a group is also what an interrupted build can lose, tens of seconds on two cores.
GROUP_CHUNKS = 1024
# New documents chunked together: at most this many, and at most CALL_CHARS characters (a
# document's tokens take ~45 bytes a character: 256 documents of 1M characters took ~11 GB).
_CHUNKED_TOGETHER = 256
# Each backend's batch measured fastest on two cores (BENCHMARKS.md, "Indexing at the host's speed").
BEST_BATCH = {"onnx": 32, "torch": 16}


class IndexingEmbedder(Protocol):
    """An Embedder that also exposes its tokenizer (chunks are cut in the model's own tokens)."""

    @property
    def model_id(self) -> str: ...

    @property
    def dim(self) -> int: ...

    @property
    def tokenizer(self) -> Any:
        """Called as a Hugging Face tokenizer is, on a list of texts (`add_special_tokens=False,
        return_offsets_mapping=True`): each text's token offsets under "offset_mapping"."""
        ...

    def embed_documents(self, texts: list[str], batch_size: int = 64) -> np.ndarray: ...


class LazyEmbedder:
    """An IndexingEmbedder loaded at its first use past its id: a build that stops before
    embedding (no documents, a bad source, nothing changed) never loads a model (seconds)."""

    def __init__(self, model_id: str, load: Callable[[], IndexingEmbedder]) -> None:
        self._model_id = model_id
        self._load = load
        self._loaded: IndexingEmbedder | None = None

    def _model(self) -> IndexingEmbedder:
        if self._loaded is None:
            loaded = self._load()
            if loaded.model_id != self._model_id:
                raise ValueError(f"the embedder loaded as {loaded.model_id!r}, expected {self._model_id!r}")
            self._loaded = loaded
        return self._loaded

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def dim(self) -> int:
        return self._model().dim

    @property
    def tokenizer(self) -> Any:
        return self._model().tokenizer

    def embed_documents(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        return self._model().embed_documents(texts, batch_size)


class RowStream:
    """A build's rows in their order, embedded a group at a time: a new or changed document is
    chunked and waits for its group (about `group_chunks` chunks, one embedder call and one
    checkpoint); a kept document, or one an interrupted build's checkpoint holds, waits behind
    it, so rows stay in order. At most three groups are held: one being embedded, one queued
    behind it, one being read and chunked. `finish`, then `close` (after a failure too)."""

    def __init__(
        self,
        writer: VersionWriter,
        embedder: IndexingEmbedder,
        chunking: ChunkingConfig,
        batch_size: int,
        checkpoints: Checkpoints,
        bar: EmbedProgress,
        group_chunks: int = GROUP_CHUNKS,
    ) -> None:
        self._writer = writer
        self._embedder = embedder
        self._chunking = chunking
        self._batch_size = batch_size
        self._checkpoints = checkpoints
        self._bar = bar
        self._group_chunks = group_chunks
        self._pending: list[_Held] = []
        self._unchunked: list[tuple[DocumentRows, Document]] = []  # new documents, chunked together
        self._unchunked_chars = 0
        self._chunker: Chunker | None = None
        self._to_embed = 0
        self._held = 0
        # The group being embedded, with the rows it writes once done (one at a time).
        self._embedding: tuple[Future[list[Embedded]], list[_Held]] | None = None
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="embed-group")
        self.resumed = 0
        self.chunks_embedded = 0
        self.embed_seconds = 0.0  # the embedding thread's time
        self.chunk_seconds = 0.0  # chunking (tokenizing), on the reading thread beside it

    def add_new(self, rows: DocumentRows, doc: Document) -> None:
        saved = self._checkpoints.take(doc.doc_id, doc.content_hash)
        if saved is not None:
            self._chunk_waiting()
            self.resumed += 1
            self._hold(rows, None, _Kept(None, saved.chunks, saved.vectors))
            return
        self._unchunked.append((rows, doc))
        self._unchunked_chars += len(doc.text)
        if len(self._unchunked) >= _CHUNKED_TOGETHER or self._unchunked_chars >= CALL_CHARS:
            self._chunk_waiting()

    def add_kept(self, rows: DocumentRows, lines: list[bytes], vectors: np.ndarray, relabel: bool) -> None:
        self._chunk_waiting()
        if not self._pending:
            self._drain()
            self._writer.add_kept(rows, lines, vectors, relabel)
            return
        self._hold(rows, None, _Kept(lines, None, vectors, relabel))

    def _chunk_waiting(self) -> None:
        """Chunks the new documents that wait (tokenizer calls bounded by characters) and holds them in order."""
        if not self._unchunked:
            return
        waiting, self._unchunked, self._unchunked_chars = self._unchunked, [], 0
        started = time.perf_counter()
        if self._chunker is None:
            self._chunker = Chunker(self._embedder.tokenizer, self._chunking)  # the model loads here
        chunked = self._chunker([doc for _, doc in waiting])
        self.chunk_seconds += time.perf_counter() - started
        for (rows, _), chunks in zip(waiting, chunked, strict=True):
            self._to_embed += len(chunks)
            self._hold(rows, chunks, None)

    def _hold(self, rows: DocumentRows, chunks: list[Chunk] | None, kept: _Kept | None) -> None:
        self._pending.append((rows, chunks, kept))
        self._held += len(chunks) if chunks is not None else len(kept.vectors) if kept else 0
        # Kept rows waiting behind a group are bounded too (a long run of them behind one new document).
        if self._to_embed >= self._group_chunks or self._held >= 4 * self._group_chunks:
            self.flush()

    def flush(self) -> None:
        """Hands what waits to the embedding thread (one group, one checkpoint), queued behind the
        group before it, whose rows are written here meanwhile (in order, once it is done)."""
        if self._unchunked:
            self._chunk_waiting()  # holds them, which may flush
            if not self._pending:
                return
        group = [(rows, chunks) for rows, chunks, _ in self._pending if chunks is not None]
        # Queued behind the group before it, so the embedding thread never waits for the rows'
        # writing (their sentences analysed) here.
        before, self._embedding = self._embedding, (self._worker.submit(self._embed_and_save, group), self._pending)
        self._pending, self._to_embed, self._held = [], 0, 0
        self._write(before)

    def finish(self) -> None:
        """Embeds and writes everything still waiting."""
        self.flush()
        self._drain()

    def close(self) -> None:
        """Waits for the embedding thread (after a failure too: nothing runs on after the build)."""
        self._worker.shutdown(wait=True, cancel_futures=True)

    def _embed_and_save(self, group: list[tuple[DocumentRows, list[Chunk]]]) -> list[Embedded]:
        started = time.perf_counter()
        items = _embed_group(group, self._embedder, self._batch_size)
        self._checkpoints.save(items)
        self.embed_seconds += time.perf_counter() - started
        return items

    def _drain(self) -> None:
        before, self._embedding = self._embedding, None
        self._write(before)

    def _write(self, embedding: tuple[Future[list[Embedded]], list[_Held]] | None) -> None:
        """Waits for a group's vectors and writes its rows (and the kept rows behind it) in order."""
        if embedding is None:
            return
        future, held = embedding
        items = future.result()
        embedded = iter(items)
        for rows, chunks, kept in held:
            if chunks is not None:
                item = next(embedded)
                self._writer.add_new(rows, item.chunks, item.vectors)
            elif kept is not None and kept.lines is not None:
                self._writer.add_kept(rows, kept.lines, kept.vectors, kept.relabel)
            elif kept is not None and kept.chunks is not None:
                self._writer.add_new(rows, kept.chunks, kept.vectors)
        chunks_done = sum(len(item.chunks) for item in items)
        self.chunks_embedded += chunks_done
        if items:
            self._bar.update(len(items), chunks_done)


@dataclass(frozen=True, slots=True)
class _Kept:
    lines: list[bytes] | None  # a kept document's stored lines, or
    chunks: list[Chunk] | None  # a checkpointed document's chunks
    vectors: np.ndarray
    relabel: bool = False


# A row waiting for its group: a document, its chunks to embed or None, a kept document's rows or None.
_Held = tuple[DocumentRows, list[Chunk] | None, _Kept | None]


def _embed_group(
    group: list[tuple[DocumentRows, list[Chunk]]], embedder: IndexingEmbedder, batch_size: int
) -> list[Embedded]:
    flat = [c for _, chunks in group for c in chunks]
    if not flat:
        empty = np.zeros((0, embedder.dim), dtype=np.float32)
        return [Embedded(rows.doc_id, rows.content_hash, [], empty) for rows, _ in group]
    matrix = embedder.embed_documents([embedding_text(c) for c in flat], batch_size)
    items: list[Embedded] = []
    row = 0
    for rows, chunks in group:
        items.append(Embedded(rows.doc_id, rows.content_hash, chunks, matrix[row : row + len(chunks)]))
        row += len(chunks)
    return items


def load_embedder(model: str, backend: str, device: str, int8: bool) -> IndexingEmbedder:
    """Through the server's factory. ONNX always runs on the CPU here, on the threads the indexer
    may use (--threads, or as many as the host share allows at each batch)."""
    from ragserve.config import EmbedderSettings
    from ragserve.factory import make_embedder

    cfg = EmbedderSettings(
        model=model,
        backend=backend,  # type: ignore[arg-type]  # checked by the caller and by the settings
        device="cpu" if backend == "onnx" else device,  # type: ignore[arg-type]
        onnx_int8=int8,
        threads=host_share.threads,
    )
    embedder = make_embedder(cfg, indexing=True)
    follow = getattr(embedder, "follow_workers", None)
    if follow is not None and host_share.most_threads():
        follow(host_share.wanted_threads, host_share.most_threads())  # the count the host share watch keeps
    return embedder
