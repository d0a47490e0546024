"""Split documents into overlapping windows of tokenizer tokens, keeping character offsets."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tokenizers import Tokenizer

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
    return Chunker(tokenizer, config)([doc])[0]


def chunk_documents(docs: Sequence[Document], tokenizer: Any, config: ChunkingConfig) -> list[list[Chunk]]:
    return Chunker(tokenizer, config)(docs)


class Chunker:
    """`chunk_document` for many documents, their tokens found with one tokenizer call. A fast
    Hugging Face tokenizer is called through its Rust tokenizer, whose batch runs on its own
    threads: the Python wrapper around it cost more than the tokenizing (BENCHMARKS.md, "A build's
    time at 100,000 chunks, again"). It works on a copy that neither truncates nor pads, whatever
    the embedder last set on the one they share."""

    def __init__(self, tokenizer: Any, config: ChunkingConfig) -> None:
        self._config = config
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:  # another tokenizer: called as a Hugging Face tokenizer is
            self._tokenizer, self._backend = tokenizer, None
            return
        self._tokenizer, self._backend = None, Tokenizer.from_str(backend.to_str())
        self._backend.no_truncation()
        self._backend.no_padding()

    def __call__(self, docs: Sequence[Document]) -> list[list[Chunk]]:
        if not docs:
            return []
        bodies = [doc.text if doc.text.strip() else doc.title for doc in docs]
        if self._backend is not None:
            offsets = [encoding.offsets for encoding in self._backend.encode_batch(bodies, add_special_tokens=False)]
        else:
            options = {"add_special_tokens": False, "return_offsets_mapping": True, "verbose": False}
            offsets = self._tokenizer(bodies, **options)["offset_mapping"]
        return [
            _windows(doc, body, spans, self._config) for doc, body, spans in zip(docs, bodies, offsets, strict=True)
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
                location=doc.outline.locate(start, doc.metadata, doc.doc_id),
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
