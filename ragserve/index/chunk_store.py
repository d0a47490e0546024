"""The docstore of a folder version: `chunks.jsonl`, one chunk a line, row i = line i.

Served from the file: a chunk is read (one `pread`) and decoded when a request asks for its row,
so a version's texts cost page cache, neither the server's heap nor its RSS, and loading one does
not decode a million records (BENCHMARKS.md, "A million passages"). Since index format 2 each
record also holds its text's sentences as analysed at build time (offsets and stemmed terms), so
no request analyses them.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, overload

import numpy as np
import orjson

from ragserve.errors import IndexLoadError
from ragserve.sentence_spans import PassageSentences
from ragserve.source_location import SourceLocation
from ragserve.types import Chunk

_SENTENCES = "sentences"
_LOCATION = "location"
_NEWLINE = 10
# Newlines are found a slab at a time: a whole-file comparison would allocate the file's size again.
_SCAN_BYTES = 1 << 26


def chunk_record(chunk: Chunk, sentences: PassageSentences | None, stored: bytes | None = None) -> bytes:
    """One docstore line (no newline): the chunk's fields, and its sentences as [start, end,
    "term term ..."] (stems hold no space); `stored`: those sentences as a record held them."""
    record: dict[str, Any] = {
        "chunk_id": chunk.chunk_id,
        "doc_id": chunk.doc_id,
        "text": chunk.text,
        "title": chunk.title,
        "source": chunk.source,
        "start": chunk.start,
        "end": chunk.end,
        "metadata": chunk.metadata,
    }
    if chunk.location is not None:
        record[_LOCATION] = chunk.location.record()
    if stored is not None:
        record[_SENTENCES] = orjson.Fragment(stored)
    elif sentences is not None:
        record[_SENTENCES] = [
            [s, e, " ".join(sorted(terms))] for (s, e), terms in zip(sentences.spans, sentences.terms, strict=True)
        ]
    return orjson.dumps(record)


def write_chunks(path: Path, chunks: Sequence[Chunk], analyse: Callable[[str], PassageSentences] | None = None) -> None:
    """`analyse`: works out a chunk's sentences when it does not carry them."""
    with path.open("wb") as handle:
        for chunk in chunks:
            sentences = chunk.sentences
            if sentences is None and analyse is not None:
                sentences = analyse(chunk.text)
            handle.write(chunk_record(chunk, sentences))
            handle.write(b"\n")


def relabeled_record(line: bytes, metadata: dict[str, Any]) -> bytes:
    """A docstore line with its chunk's metadata replaced; the rest (its sentences) as stored."""
    record = orjson.loads(line)
    stored = record.pop(_SENTENCES, None)
    record["metadata"] = metadata
    if stored is not None:
        record[_SENTENCES] = stored
    return orjson.dumps(record)


def record_text(line: bytes) -> tuple[str, str]:
    """A docstore line's chunk (title, text)."""
    record = orjson.loads(line)
    return str(record.get("title", "")), str(record["text"])


def decode_chunk(line: bytes, where: str) -> Chunk:
    try:
        record = orjson.loads(line)
        stored = record.pop(_SENTENCES, None)
        location = location_of(record.pop(_LOCATION, None))
        return Chunk(**record, sentences=None if stored is None else _sentences(stored), location=location)
    except (orjson.JSONDecodeError, TypeError, ValueError, AttributeError) as exc:
        raise IndexLoadError(f"{where}: bad docstore record: {exc}") from exc


def location_of(stored: Any) -> SourceLocation | None:
    """A stored location (None for a record written before index format 3)."""
    if stored is None:
        return None
    if not isinstance(stored, dict) or not isinstance(stored.get("locator"), str):
        raise ValueError("a location is not an object with a locator")
    page, page_start = stored.get("page", 0), stored.get("page_start", 0)
    section = stored.get("section", [])
    if not isinstance(page, int) or not isinstance(page_start, int) or page < 0 or page_start < 0:
        raise ValueError("a location's page is not a count")
    if not isinstance(section, list) or not all(isinstance(title, str) for title in section):
        raise ValueError("a location's section is not a list of titles")
    breaks = stored.get("page_breaks", [])
    if not isinstance(breaks, list) or not all(_is_page_break(pair) for pair in breaks):
        raise ValueError("a location's page_breaks are not (page, first character) pairs")
    page_breaks = tuple((pair[0], pair[1]) for pair in breaks)
    return SourceLocation(stored["locator"], page, page_start, tuple(section), page_breaks)


def _is_page_break(pair: Any) -> bool:
    return (
        isinstance(pair, list)
        and len(pair) == 2
        and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in pair)
    )


def _sentences(stored: list[list[Any]]) -> PassageSentences:
    spans = tuple((int(s), int(e)) for s, e, _ in stored)
    if any(not 0 <= s <= e for s, e in spans):
        raise ValueError("a sentence span is out of order")
    return PassageSentences(spans, tuple(frozenset(str(terms).split()) for _, _, terms in stored))


def read_chunks(path: Path) -> list[Chunk]:
    """Every record, decoded (the indexer's incremental builds; a server maps them: ChunkStore)."""
    with path.open("rb") as handle:
        return [decode_chunk(line, f"{path}:{n}") for n, line in enumerate(handle, start=1)]


class ChunkStore(Sequence[Chunk]):
    """A docstore read a row at a time; `store[row]` reads and decodes one record. Safe from
    several threads. Plain reads, not a map: a mapped row brings the pages around it into this
    process's RSS (the kernel maps cached neighbours in on each fault), and after a few hundred
    requests the whole docstore counted there (BENCHMARKS.md, "A reload that grows the served
    graph, and a docstore read without a map")."""

    def __init__(self, path: Path, count: int) -> None:
        self._path = path
        self._ends = file_line_ends(path)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        # Closed by `close`, or when the store is garbage-collected with its version.
        self._closer = weakref.finalize(self, os.close, fd)
        self._fd = fd
        # Requests read scattered rows: a page that is not cached costs one page of I/O, not the
        # kernel's readahead around it (megabytes, behind whatever else reads the disk).
        _advise_random(fd)
        if len(self._ends) != count:
            self.close()
            raise IndexLoadError(
                f"index at {path.parent}: docstore has {len(self._ends)} chunks, manifest says {count}"
            )
        self._starts = np.concatenate([[0], self._ends[:-1] + 1]) if count else self._ends

    def __len__(self) -> int:
        return len(self._ends)

    def close(self) -> None:
        """Closes the file now (a check that loaded it to see that it loads)."""
        self._closer()

    @overload
    def __getitem__(self, row: int) -> Chunk: ...

    @overload
    def __getitem__(self, row: slice) -> list[Chunk]: ...

    def __getitem__(self, row: int | slice) -> Chunk | list[Chunk]:
        if isinstance(row, slice):
            return [self[i] for i in range(*row.indices(len(self)))]
        if not -len(self) <= row < len(self):
            raise IndexError(row)
        row %= len(self)
        if not self._closer.alive:
            raise IndexLoadError(f"{self._path}: the docstore is closed")
        start, end = int(self._starts[row]), int(self._ends[row])
        line = os.pread(self._fd, end - start, start)
        if len(line) != end - start:
            raise IndexLoadError(f"{self._path}:{row + 1}: the docstore was cut short under the server")
        return decode_chunk(line, f"{self._path}:{row + 1}")

    def __iter__(self) -> Iterator[Chunk]:
        return (self[i] for i in range(len(self)))


class Prefix(Sequence[Chunk]):
    """The first `count` rows of a docstore, each decoded only when read (warming reads them a few
    at a time, so no one call holds the interpreter for the whole corpus)."""

    def __init__(self, rows: Sequence[Chunk], count: int) -> None:
        self._rows = rows
        self._count = min(count, len(rows))

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, row: int) -> Chunk: ...

    @overload
    def __getitem__(self, row: slice) -> list[Chunk]: ...

    def __getitem__(self, row: int | slice) -> Chunk | list[Chunk]:
        if isinstance(row, slice):
            return [self._rows[i] for i in range(*row.indices(self._count))]
        if not -self._count <= row < self._count:
            raise IndexError(row)
        return self._rows[row % self._count]


def _advise_random(fd: int) -> None:
    """An access-pattern hint to the kernel, where it takes one (a hint: never fails)."""
    if hasattr(os, "posix_fadvise"):
        with contextlib.suppress(OSError):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)


def file_line_ends(path: Path) -> np.ndarray:
    """Offsets of every line's end (its newline, or the end of a last line without one), the file
    read a slab at a time: newlines are found per slab, since a whole-file comparison would
    allocate the file's size again."""
    parts = []
    offset = 0
    last = _NEWLINE
    with path.open("rb") as handle:
        while slab := handle.read(_SCAN_BYTES):
            parts.append(np.flatnonzero(np.frombuffer(slab, dtype=np.uint8) == _NEWLINE).astype(np.int64) + offset)
            offset += len(slab)
            last = slab[-1]
    ends = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    if offset and last != _NEWLINE:
        ends = np.append(ends, offset)
    return ends
