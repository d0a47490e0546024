"""BEIR corpus files (`corpus.jsonl`): one {"_id", "title", "text", "metadata"?} object per line,
each a document, read line by line within a file's caps."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import orjson

from indexer.formats import FileRejected, LoadLimits, check_text_size
from indexer.loaders import Document, Skipped, capped_title
from indexer.metadata import MetadataError, check_names, derived_fields

_DRAIN_BYTES = 1 << 20


def _bounded_lines(handle: BinaryIO, cap: int) -> Iterator[bytes | None]:
    """Each line of at most `cap` bytes (newline excluded), or None for a longer one: that one is
    read past in bounded pieces, never held whole."""
    while line := handle.readline(cap + 1):
        if line.endswith(b"\n") or len(line) <= cap:
            yield line
            continue
        while (rest := handle.readline(_DRAIN_BYTES)) and not rest.endswith(b"\n"):
            pass
        yield None


def _beir_record(line: bytes, where: str, limits: LoadLimits) -> Document | Skipped | None:
    """One corpus line as a document, a reported skip, or None for a blank line."""
    if not line.strip():
        return None
    try:
        record = orjson.loads(line)
        doc_id = str(record["_id"])
        text = str(record.get("text") or "")
        title = str(record.get("title") or "")
        supplied = record.get("metadata") or {}
        if not isinstance(supplied, dict):
            return Skipped(where, "bad record: metadata is not an object")
        supplied = check_names(supplied)
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        return Skipped(where, f"bad record: {exc}")
    except MetadataError as exc:
        return Skipped(where, f"unreadable metadata: {exc}")
    try:
        check_text_size(len(text), limits)  # a record is one document: a file's text cap
    except FileRejected as exc:
        return Skipped(where, f"too large: {exc}")
    if not text.strip() and not title.strip():
        return Skipped(where, "empty")
    title = capped_title(title)
    return Document(doc_id, title, text, where, metadata={**supplied, **derived_fields(doc_id, None, title)})


def iter_beir(corpus: Path, limits: LoadLimits | None = None) -> Iterator[Document | Skipped]:
    """BEIR corpus.jsonl: one {"_id", "title", "text"} object per line. A line is read with a
    file's byte cap (`max_file_bytes`): one huge line must not take the indexer's memory."""
    limits = limits or LoadLimits()
    with corpus.open("rb") as handle:
        for line_no, line in enumerate(_bounded_lines(handle, limits.max_file_bytes), start=1):
            where = f"{corpus.name}:{line_no}"
            if line is None:
                yield Skipped(where, f"too large: line is over the limit of {limits.max_file_bytes:,} bytes")
                continue
            item = _beir_record(line, where, limits)
            if item is not None:
                yield item
