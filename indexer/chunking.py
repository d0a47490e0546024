"""Split documents into overlapping windows of tokenizer tokens, keeping character offsets."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from indexer.loaders import Document
from ragserve.types import Chunk


@dataclass(frozen=True, slots=True)
class ChunkingConfig:
    # MiniLM's position limit is 256 word pieces; 200 leaves room for the title and specials.
    size_tokens: int = 200
    overlap_tokens: int = 40

    def __post_init__(self) -> None:
        if self.size_tokens < 8:
            raise ValueError("chunk size must be at least 8 tokens")
        if not 0 <= self.overlap_tokens < self.size_tokens:
            raise ValueError("chunk overlap must be >= 0 and smaller than the chunk size")


def chunk_document(doc: Document, tokenizer: Any, config: ChunkingConfig) -> list[Chunk]:
    """Chunk ids are `<doc_id>#<n>`: stable for the same text and settings."""
    return chunk_documents([doc], tokenizer, config)[0]


def chunk_documents(docs: Sequence[Document], tokenizer: Any, config: ChunkingConfig) -> list[list[Chunk]]:
    """`chunk_document` of each, with one tokenizer call for all: a fast tokenizer's batch runs on
    its own threads, and its per-call cost is paid once (BENCHMARKS.md, "A build that streams")."""
    if not docs:
        return []
    bodies = [doc.text if doc.text.strip() else doc.title for doc in docs]
    encodings = tokenizer(bodies, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
    return [
        _windows(doc, body, offsets, config)
        for doc, body, offsets in zip(docs, bodies, encodings["offset_mapping"], strict=True)
    ]


def _windows(doc: Document, body: str, offsets: Sequence[tuple[int, int]], config: ChunkingConfig) -> list[Chunk]:
    if not offsets:
        return []
    chunks: list[Chunk] = []
    step = config.size_tokens - config.overlap_tokens
    start_tok = 0
    while True:
        window = offsets[start_tok : start_tok + config.size_tokens]
        start, end = window[0][0], window[-1][1]
        chunks.append(
            Chunk(
                chunk_id=f"{doc.doc_id}#{len(chunks)}",
                doc_id=doc.doc_id,
                text=body[start:end],
                title=doc.title,
                source=doc.source,
                start=start,
                end=end,
            )
        )
        if start_tok + config.size_tokens >= len(offsets):
            break
        start_tok += step
    return chunks


def embedding_text(chunk: Chunk) -> str:
    """What the bi-encoder sees: the title gives a chunk from the middle of a document its topic."""
    if not chunk.title or chunk.title in chunk.text[: len(chunk.title) + 8]:
        return chunk.text
    return f"{chunk.title}\n{chunk.text}"
