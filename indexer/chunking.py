"""Split documents into overlapping windows of tokenizer tokens, keeping character offsets."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tokenizers import Tokenizer

from indexer.loaders import Document
from ragserve.types import Chunk

# Characters one tokenizer call may hold (about 40 MiB of encodings).
CALL_CHARS = 1_000_000
# A longer document is cut into pieces of this many characters at most, tokenized in one call on
# the tokenizer's threads (one piece would run on one).
PIECE_CHARS = 100_000

# A text's tokens as (first character, end character) pairs, as the tokenizer gives them.
Offsets = Sequence[tuple[int, int]]


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
        backend = tokenizer if isinstance(tokenizer, Tokenizer) else getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:  # another tokenizer: called as a Hugging Face tokenizer is
            self._tokenizer, self._backend = tokenizer, None
            return
        self._tokenizer, self._backend = None, Tokenizer.from_str(backend.to_str())
        self._backend.no_truncation()
        self._backend.no_padding()

    def __call__(self, docs: Sequence[Document]) -> list[list[Chunk]]:
        """Each tokenizer call gets at most CALL_CHARS characters: its encodings take about 40
        bytes a character (a 1.2M-character document: ~50 MiB), so a call is bounded by the text
        it holds, not by how many documents it holds; a longer document is tokenized in pieces cut
        at whitespace (word-piece tokens never cross it), side by side on the tokenizer's threads."""
        bodies = [doc.text if doc.text.strip() else doc.title for doc in docs]
        spans: list[list[Offsets]] = [[] for _ in docs]
        batch: list[tuple[int, int, str]] = []  # (document, its piece's first character, text)
        held = 0
        for index, body in enumerate(bodies):
            for first, piece in _pieces(body, min(PIECE_CHARS, CALL_CHARS)):
                if batch and held + len(piece) > CALL_CHARS:
                    self._tokenize(batch, spans)
                    batch, held = [], 0
                batch.append((index, first, piece))
                held += len(piece)
        if batch:
            self._tokenize(batch, spans)
        return [
            _windows(doc, body, _joined(parts), self._config)
            for doc, body, parts in zip(docs, bodies, spans, strict=True)
        ]

    def _tokenize(self, batch: list[tuple[int, int, str]], spans: list[list[Offsets]]) -> None:
        """One tokenizer call; each piece's token offsets, shifted to its document's characters."""
        texts = [text for _, _, text in batch]
        if self._backend is not None:
            offsets = [encoding.offsets for encoding in self._backend.encode_batch(texts, add_special_tokens=False)]
        else:
            options = {"add_special_tokens": False, "return_offsets_mapping": True, "verbose": False}
            offsets = self._tokenizer(texts, **options)["offset_mapping"]
        for (index, first, _), piece in zip(batch, offsets, strict=True):
            spans[index].append([(start + first, end + first) for start, end in piece] if first else piece)


def _pieces(body: str, most: int) -> list[tuple[int, str]]:
    """`body` in pieces of at most `most` characters, each cut just before whitespace when it can be."""
    pieces: list[tuple[int, str]] = []
    start = 0
    while len(body) - start > most:
        cut = max(body.rfind(" ", start + 1, start + most), body.rfind("\n", start + 1, start + most))
        cut = cut if cut > start else start + most
        pieces.append((start, body[start:cut]))
        start = cut
    pieces.append((start, body[start:]))
    return pieces


def _joined(parts: list[Offsets]) -> Offsets:
    return parts[0] if len(parts) == 1 else [pair for part in parts for pair in part]


def _windows(doc: Document, body: str, offsets: Offsets, config: ChunkingConfig) -> list[Chunk]:
    if not len(offsets):
        return []
    chunks: list[Chunk] = []
    step = config.size_tokens - config.overlap_tokens
    start_tok = 0
    while True:
        last = min(start_tok + config.size_tokens, len(offsets)) - 1
        start, end = offsets[start_tok][0], offsets[last][1]
        chunks.append(
            Chunk(
                chunk_id=f"{doc.doc_id}#{len(chunks)}",
                doc_id=doc.doc_id,
                text=body[start:end],
                title=doc.title,
                source=doc.source,
                start=start,
                end=end,
                location=doc.outline.locate(start, end, doc.metadata, doc.doc_id),
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
