"""Document sources: a folder tree of .txt/.md/.html/.pdf files, or a BEIR corpus.jsonl."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from indexer.formats import (
    READERS,
    TEXT_SUFFIXES,
    Extracted,
    FileRejected,
    LoadLimits,
    Reader,
    read_capped,
)
from indexer.metadata import (
    SIDECAR_SUFFIX,
    MetadataError,
    check_names,
    derived_fields,
    sidecar_metadata,
    split_front_matter,
)
from indexer.outline import Outline, markdown_headings
from indexer.parse_worker import IsolatedParser


class SourceError(Exception):
    """A source that cannot be read at all (missing, empty, wrong type)."""


@dataclass(frozen=True, slots=True)
class Document:
    doc_id: str
    title: str
    text: str
    source: str
    # Identity of the content: an incremental build re-embeds a document only when it changes.
    content_hash: str = field(default="")
    # Its metadata as read (indexer/metadata.py): front matter, sidecar, BEIR `metadata`, derived.
    metadata: dict[str, Any] = field(default_factory=dict)
    # Its pages and headings by character offset, and its locator (indexer/outline.py).
    outline: Outline = field(default_factory=Outline)

    def __post_init__(self) -> None:
        if not self.content_hash:
            digest = hashlib.sha256(self.title.encode() + b"\x00" + self.text.encode()).hexdigest()
            object.__setattr__(self, "content_hash", digest)


@dataclass(frozen=True, slots=True)
class Skipped:
    source: str
    reason: str
    # True for files that are not documents at all (images, LICENSE): counted, not warned about.
    ignored: bool = False


MAX_TITLE_CHARS = 200


def capped_title(title: str) -> str:
    # A title goes into every chunk of its document and every prompt passage: a document's own
    # (HTML <title>, PDF metadata, BEIR field) is as untrusted as its text.
    return title[:MAX_TITLE_CHARS]


def _title_of(text: str, fallback: str) -> str:
    for line in text.splitlines():
        stripped = line.strip().lstrip("#").strip()
        if stripped:
            return capped_title(stripped)
    return fallback


def display_name(name: str) -> str:
    """A file name as valid UTF-8 text: unchanged when it already is, else each undecodable byte as
    `\\xNN` (JSON writers and tokenizers reject the lone surrogates Python uses for such bytes).
    A real file spelled with those escapes collides, and is then skipped as a duplicate id."""
    try:
        name.encode("utf-8")
        return name
    except UnicodeEncodeError:
        return os.fsencode(name).decode("utf-8", "backslashreplace")


def _outside(path: Path, root: Path) -> bool:
    return not path.resolve().is_relative_to(root)


def iter_folder(root: Path, limits: LoadLimits | None = None) -> Iterator[Document | Skipped]:
    """Every supported file under `root`; doc_id is the path relative to root (POSIX form).

    Symbolic links are never followed: one leading out of the tree is reported (indexing it would
    serve a file the operator did not put in the corpus); one inside the tree is only counted, as
    its target is indexed under its own path. Linked folders are not descended into at all.
    """
    return iter_folder_files(root, sorted(p for p in root.rglob("*") if p.is_file() or p.is_symlink()), limits)


def iter_folder_files(
    root: Path,
    paths: list[Path],
    limits: LoadLimits | None = None,
    readers: dict[str, Reader] | None = None,
) -> Iterator[Document | Skipped]:
    """`readers` overrides the reader for some suffixes (tests); the size, text and time caps still apply."""
    limits = limits or LoadLimits()
    readers = {**READERS, **(readers or {})}
    real_root = root.resolve()
    parser = IsolatedParser()
    try:
        for path in paths:
            relative = display_name(path.relative_to(root).as_posix())
            if any(part.startswith(".") for part in path.relative_to(root).parts):
                continue  # hidden files and folders (.git, .DS_Store) are not documents
            if path.is_symlink():
                if _outside(path, real_root):
                    yield Skipped(relative, "symbolic link leading outside the source folder: not followed")
                else:
                    yield Skipped(relative, "symbolic link: its target is indexed under its own path", ignored=True)
                continue
            if path.name.endswith(SIDECAR_SUFFIX):
                continue  # another file's metadata, read with that file
            reader = readers.get(path.suffix.lower())
            if reader is None:
                yield Skipped(
                    relative, f"unsupported file type {display_name(path.suffix) or '(none)'!r}", ignored=True
                )
                continue
            try:
                data = read_capped(path, limits)
                if path.suffix.lower() in TEXT_SUFFIXES:
                    extracted = reader(data, limits)
                else:
                    extracted = parser.parse(reader, data, limits)
            except FileRejected as exc:
                yield Skipped(relative, f"too large or slow: {exc}")
                continue
            except UnicodeDecodeError as exc:
                yield Skipped(
                    relative,
                    f"unreadable: not {limits.encoding.upper()} text ({exc.reason} at byte {exc.start}); "
                    "convert it to UTF-8 or pass --encoding (cp1252 is common for Windows text)",
                )
                continue
            except OSError as exc:
                yield Skipped(relative, f"unreadable: {exc.strerror or exc}")
                continue
            except Exception as exc:  # a malformed PDF/HTML raises library-specific errors: skip the file
                yield Skipped(relative, f"cannot extract text: {type(exc).__name__}: {exc}")
                continue
            yield _document_of(path, relative, extracted)
    finally:
        parser.close()


def _document_of(path: Path, relative: str, extracted: Extracted) -> Document | Skipped:
    """A file's text as a document, with its metadata (front matter, a sidecar file, derived fields)."""
    title, text = extracted[0], extracted[1]
    outline = extracted[2] if len(extracted) == 3 else Outline()
    markdown = path.suffix.lower() == ".md"
    try:
        front, text = split_front_matter(text) if markdown else ({}, text)
        supplied = {**check_names(front), **check_names(sidecar_metadata(path))}
    except MetadataError as exc:
        return Skipped(relative, f"unreadable metadata: {exc}")
    if not text.strip():
        return Skipped(relative, "no text")
    given_title = supplied.get("title") if isinstance(supplied.get("title"), str) else ""
    title = capped_title(given_title or title) or _title_of(text, display_name(path.stem))
    # What the indexer derives wins: an author cannot move a file to another folder or type for a filter.
    metadata = {**supplied, **derived_fields(relative, path, title)}
    if markdown:
        outline = Outline(headings=markdown_headings(text))
    outline = dataclasses.replace(outline, locator=relative)
    return Document(relative, title, text, relative, metadata=metadata, outline=outline)
