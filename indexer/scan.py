"""A build's first pass over its source: every document is read once, spilled to the build folder
as one JSON line, and only its id, content hash and metadata kept, so the filterable fields can be
chosen from all documents' metadata before any row is written, without holding their texts. The
second pass reads the spill: both passes see the same documents, even if the source changes
meanwhile, and no file is parsed twice."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from indexer.formats import LoadLimits
from indexer.loaders import Document, Skipped, SourceError
from indexer.metadata import Fields, MetadataError, choose_fields, normalized
from indexer.outline import Outline
from indexer.sources import iter_source
from indexer.version_writer import DocumentRows


@dataclass
class Scan:
    spill: Path
    documents: list[DocumentRows]  # in source order, each with its metadata as stored
    fields: Fields
    skipped: list[Skipped]
    fields_left_out: dict[str, str]


def metadata_hash(metadata: dict[str, Any]) -> str:
    return hashlib.sha256(orjson.dumps(metadata, option=orjson.OPT_SORT_KEYS)).hexdigest()[:32]


def scan_source(
    source: Path,
    spill: Path,
    on_skip: Callable[[Skipped], None] | None,
    limits: LoadLimits | None,
    declared: dict[str, str],
) -> Scan:
    skipped: list[Skipped] = []

    def skip(item: Skipped) -> None:
        skipped.append(item)
        if on_skip:
            on_skip(item)

    read: list[tuple[str, str, dict[str, Any], str]] = []  # id, hash, metadata as read, source
    seen: set[str] = set()
    with spill.open("wb") as out:
        for item in iter_source(source, limits):
            if isinstance(item, Document) and item.doc_id in seen:
                item = Skipped(item.source, f"duplicate document id {item.doc_id!r}")
            if isinstance(item, Skipped):
                skip(item)
                continue
            seen.add(item.doc_id)
            record: dict[str, Any] = {"doc_id": item.doc_id, "title": item.title, "text": item.text}
            record.update(source=item.source, outline=item.outline.to_record())
            out.write(orjson.dumps({**record, "hash": item.content_hash}) + b"\n")
            read.append((item.doc_id, item.content_hash, item.metadata, item.source))
    if not read:
        raise SourceError(
            f"no indexable documents in {source} (.txt, .md, .html and .pdf files, or a BEIR corpus.jsonl)"
        )
    fields = choose_fields([metadata for _, _, metadata, _ in read], declared)
    documents: list[DocumentRows] = []
    for doc_id, content_hash, metadata, where in read:
        try:
            stored = normalized(metadata, fields.schema)
        except MetadataError as exc:  # a value that does not fit: the document is skipped, whole
            skip(Skipped(where, str(exc)))
            continue
        documents.append(DocumentRows(doc_id, content_hash, metadata_hash(stored), stored))
    if not documents:
        raise SourceError("no document's metadata fits the declared fields (each was reported)")
    return Scan(spill, documents, fields, skipped, fields.left_out)


def read_spill(spill: Path, metadata: dict[str, DocumentRows]) -> Iterator[tuple[DocumentRows, Document]]:
    """The spilled documents in source order, each with its row record (`metadata`: by id; a
    document not in it was skipped)."""
    with spill.open("rb") as handle:
        for line in handle:
            record = orjson.loads(line)
            rows = metadata.get(record["doc_id"])
            if rows is None:
                continue
            content_hash, outline = record.pop("hash"), Outline.of_record(record.pop("outline", None))
            yield rows, Document(**record, content_hash=content_hash, metadata=rows.metadata, outline=outline)
