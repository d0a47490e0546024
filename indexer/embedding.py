"""Chunk and embed a build's new or changed documents, in groups of about GROUP_CHUNKS chunks:
each group is one call to the embedder (which sorts its chunks by token count, so a batch pads
little) and one checkpoint (indexer/checkpoint.py) as soon as it is done."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from indexer import host_share
from indexer.checkpoint import Checkpoints, Embedded
from indexer.chunking import ChunkingConfig, chunk_document, embedding_text
from indexer.loaders import Document
from indexer.progress import EmbedProgress
from ragserve.types import Chunk

# Chunks per group. Length-sorted batches over a thousand chunks pad under 1% on SciFact (256:
# about 3%); a group is also what an interrupted build can lose, tens of seconds on two cores.
GROUP_CHUNKS = 1024


class IndexingEmbedder(Protocol):
    """An Embedder that also exposes its tokenizer (chunks are cut in the model's own tokens)."""

    @property
    def model_id(self) -> str: ...

    @property
    def dim(self) -> int: ...

    @property
    def tokenizer(self) -> Any: ...

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


@dataclass
class EmbedOutcome:
    embedded: dict[str, Embedded] = field(default_factory=dict)
    resumed: int = 0  # documents taken from checkpoints
    chunks_embedded: int = 0  # chunks embedded in this run


def embed_all(
    todo: list[Document],
    embedder: IndexingEmbedder,
    chunking: ChunkingConfig,
    batch_size: int,
    checkpoints: Checkpoints,
    progress: bool,
    group_chunks: int = GROUP_CHUNKS,
) -> EmbedOutcome:
    outcome = EmbedOutcome()
    saved = checkpoints.load()
    rest: list[Document] = []
    for doc in todo:
        done = saved.get(doc.doc_id)
        if done is not None and done.content_hash == doc.content_hash:
            outcome.embedded[doc.doc_id] = done
        else:
            rest.append(doc)
    outcome.resumed = len(todo) - len(rest)
    bar = EmbedProgress(len(rest), progress)
    try:
        for group in _groups(rest, embedder.tokenizer, chunking, group_chunks):
            items = _embed_group(group, embedder, batch_size)
            checkpoints.save(items)
            for item in items:
                outcome.embedded[item.doc_id] = item
            chunks = sum(len(item.chunks) for item in items)
            outcome.chunks_embedded += chunks
            bar.update(len(items), chunks)
    finally:
        bar.close()
    return outcome


def _groups(
    docs: list[Document], tokenizer: Any, chunking: ChunkingConfig, group_chunks: int
) -> Iterator[list[tuple[Document, list[Chunk]]]]:
    group: list[tuple[Document, list[Chunk]]] = []
    size = 0
    for doc in docs:
        chunks = chunk_document(doc, tokenizer, chunking)
        group.append((doc, chunks))
        size += len(chunks)
        if size >= group_chunks:
            yield group
            group, size = [], 0
    if group:
        yield group


def _embed_group(
    group: list[tuple[Document, list[Chunk]]], embedder: IndexingEmbedder, batch_size: int
) -> list[Embedded]:
    flat = [c for _, chunks in group for c in chunks]
    matrix = (
        embedder.embed_documents([embedding_text(c) for c in flat], batch_size)
        if flat
        else np.zeros((0, embedder.dim), dtype=np.float32)
    )
    items: list[Embedded] = []
    row = 0
    for doc, chunks in group:
        items.append(Embedded(doc.doc_id, doc.content_hash, chunks, matrix[row : row + len(chunks)]))
        row += len(chunks)
    return items


def load_embedder(model: str, backend: str, device: str, int8: bool) -> IndexingEmbedder:
    """Through the server's factory. ONNX always runs on the CPU here, on the threads the indexer
    may use (--threads)."""
    from ragserve.config import EmbedderSettings
    from ragserve.factory import make_embedder

    cfg = EmbedderSettings(
        model=model,
        backend=backend,  # type: ignore[arg-type]  # checked by the caller and by the settings
        device="cpu" if backend == "onnx" else device,  # type: ignore[arg-type]
        onnx_int8=int8,
        threads=host_share.threads,
    )
    return make_embedder(cfg, indexing=True)
