"""Click to source: the text of a document around a citation's quote, rebuilt from the document's
chunks (a chunk is its document's extracted text from `start` to `end`, and neighbours overlap), so
a page or an agent can show the quote in its place. Only chunks the caller's grant may read are
used: the window never reaches into a chunk the caller could not fetch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ragserve.errors import InvalidArgument
from ragserve.filters import Filter, matches
from ragserve.index.base import SearchIndex
from ragserve.source_location import SourceLocation, located_at
from ragserve.types import Chunk

# Characters on each side of the quote by default, and at most (a window stays a screenful or two).
DEFAULT_CONTEXT_CHARS = 600
MOST_CONTEXT_CHARS = 8000


@dataclass(frozen=True, slots=True)
class SourceView:
    """`text` is the document's extracted text from `text_start`; the quote is the document's text
    from `quote_start` to `quote_end` (offsets in the document, as a Citation gives them)."""

    chunk: Chunk
    text: str
    text_start: int
    quote_start: int
    quote_end: int

    @property
    def location(self) -> SourceLocation | None:
        """Where the quote stands: its own page, not only its chunk's first."""
        return located_at(self.chunk.location, self.quote_start)

    @property
    def marked(self) -> tuple[str, str, str]:
        """The text before the quote, the quote, and the text after it."""
        a, b = self.quote_start - self.text_start, self.quote_end - self.text_start
        return self.text[:a], self.text[a:b], self.text[b:]


def _number(chunk_id: str) -> tuple[str, int] | None:
    doc_id, _, n = chunk_id.rpartition("#")
    return (doc_id, int(n)) if doc_id and n.isdigit() and len(n) < 10 else None


def neighbourhood(index: SearchIndex, chunk_id: str, grant: Filter | None, context_chars: int) -> list[Chunk]:
    """The chunk and the neighbours a window of `context_chars` may reach, that `grant` may read
    (the chunk itself first when it is readable; none when it is not, or unknown alike)."""
    parsed = _number(chunk_id)
    if parsed is None:
        return []
    doc_id, n = parsed
    found = index.chunks_by_id([chunk_id], grant)
    if not found or not matches(grant, found[0].metadata, index.fields):
        return []
    chunk = found[0]
    # Neighbours overlap: each adds at most its length of new text on its side.
    reach = max(1, -(-context_chars // max(1, chunk.end - chunk.start)) + 1)
    around = [f"{doc_id}#{m}" for m in range(max(0, n - reach), n + reach + 1) if m != n]
    readable = [c for c in index.chunks_by_id(around, grant) if matches(grant, c.metadata, index.fields)]
    return [chunk, *(c for c in readable if c.doc_id == doc_id)]


def source_view(chunks: Sequence[Chunk], start: int | None, end: int | None, context_chars: int) -> SourceView:
    """The window around [start, end) (the first chunk's own range when unset), which must lie
    within the first chunk: the text of `chunks` (in any order) from `context_chars` before to
    `context_chars` after, gaps between chunks (never seen: whitespace between tokens) as spaces."""
    chunk = chunks[0]
    start = chunk.start if start is None else start
    end = chunk.end if end is None else end
    if not chunk.start <= start <= end <= chunk.end:
        raise InvalidArgument("start", f"the quote must lie within the chunk's range [{chunk.start}, {chunk.end})")
    if not 0 <= context_chars <= MOST_CONTEXT_CHARS:
        raise InvalidArgument("context_chars", f"must be 0..{MOST_CONTEXT_CHARS}")
    ordered = sorted(chunks, key=lambda c: c.start)
    first = max(start - context_chars, ordered[0].start)
    last = min(end + context_chars, max(c.end for c in ordered))
    pieces, at = [], first
    for piece in ordered:
        if piece.end <= at or piece.start >= last:
            continue
        if piece.start > at:
            pieces.append(" " * (piece.start - at))
            at = piece.start
        upto = min(piece.end, last)
        pieces.append(piece.text[at - piece.start : upto - piece.start])
        at = upto
    return SourceView(chunk, "".join(pieces), first, start, end)
