"""Document sources: a folder tree of .txt/.md files, or a BEIR corpus.jsonl."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson

TEXT_SUFFIXES = {".txt", ".md"}


class SourceError(Exception):
    """A source that cannot be read at all (missing, empty, wrong type)."""


@dataclass(frozen=True, slots=True)
class Document:
    doc_id: str
    title: str
    text: str
    source: str


@dataclass(frozen=True, slots=True)
class Skipped:
    source: str
    reason: str


def _title_of(text: str, fallback: str) -> str:
    for line in text.splitlines():
        stripped = line.strip().lstrip("#").strip()
        if stripped:
            return stripped[:200]
    return fallback


def iter_folder(root: Path) -> Iterator[Document | Skipped]:
    """Every .txt/.md file under `root`; doc_id is the path relative to root (POSIX form)."""
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        relative = path.relative_to(root).as_posix()
        if path.suffix.lower() not in TEXT_SUFFIXES:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            yield Skipped(relative, f"unreadable: {exc}")
            continue
        if not text.strip():
            yield Skipped(relative, "empty")
            continue
        yield Document(relative, _title_of(text, path.stem), text, relative)


def iter_beir(corpus: Path) -> Iterator[Document | Skipped]:
    """BEIR corpus.jsonl: one {"_id", "title", "text"} object per line."""
    with corpus.open("rb") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{corpus.name}:{line_no}"
            try:
                record = orjson.loads(line)
                doc_id = str(record["_id"])
                text = str(record.get("text") or "")
                title = str(record.get("title") or "")
            except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
                yield Skipped(where, f"bad record: {exc}")
                continue
            if not text.strip() and not title.strip():
                yield Skipped(where, "empty")
                continue
            yield Document(doc_id, title, text, where)


def iter_source(source: Path) -> Iterator[Document | Skipped]:
    if not source.exists():
        raise SourceError(f"{source} does not exist")
    if source.is_dir():
        return iter_folder(source)
    if source.name.endswith(".jsonl"):
        return iter_beir(source)
    raise SourceError(f"{source} is neither a folder nor a BEIR corpus .jsonl file")
