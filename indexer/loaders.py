"""Document sources: a folder tree of .txt/.md/.html/.pdf files, or a BEIR corpus.jsonl."""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import io
import logging
import multiprocessing
import multiprocessing.pool
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from indexer.metadata import (
    SIDECAR_SUFFIX,
    MetadataError,
    check_names,
    derived_fields,
    sidecar_metadata,
    split_front_matter,
)
from indexer.outline import Outline, html_headings, markdown_headings

TEXT_SUFFIXES = {".txt", ".md"}
HTML_SUFFIXES = {".html", ".htm"}
PDF_SUFFIXES = {".pdf"}
SUPPORTED_SUFFIXES = TEXT_SUFFIXES | HTML_SUFFIXES | PDF_SUFFIXES


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


def _capped_title(title: str) -> str:
    # A title goes into every chunk of its document and every prompt passage: a document's own
    # (HTML <title>, PDF metadata, BEIR field) is as untrusted as its text.
    return title[:MAX_TITLE_CHARS]


def _title_of(text: str, fallback: str) -> str:
    for line in text.splitlines():
        stripped = line.strip().lstrip("#").strip()
        if stripped:
            return _capped_title(stripped)
    return fallback


DEFAULT_MAX_FILE_MB = 20.0
DEFAULT_MAX_TEXT_CHARS = 5_000_000  # about 2,500 pages of prose
DEFAULT_PARSE_TIMEOUT_S = 60.0
# The parse worker's address space. About 64 MB is the worker itself; html.parser builds a tree
# of about 130 times the file (a 20 MB file of tiny tags would take some 2.7 GB).
DEFAULT_PARSE_MEMORY_MB = 2048


@dataclass(frozen=True, slots=True)
class LoadLimits:
    """Per-file caps, so one hostile file (a PDF or HTML bomb, a huge dump) cannot stall a build."""

    max_file_bytes: int = int(DEFAULT_MAX_FILE_MB * 1024 * 1024)
    # Extracted text; checked page by page while a PDF is read.
    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS
    # HTML and PDF are parsed in a worker process that is killed when a file takes longer.
    parse_timeout_s: float = DEFAULT_PARSE_TIMEOUT_S
    # How plain-text and Markdown files are decoded (`build --encoding`); HTML and PDF say their own.
    encoding: str = "utf-8"
    # The worker's memory: a file that needs more is skipped, instead of the host's OOM killer
    # picking a process (on a shared host, perhaps the serving sidecar).
    parse_memory_mb: int = DEFAULT_PARSE_MEMORY_MB


class FileRejected(Exception):
    """A file over one of the LoadLimits; the message is the reason reported for it."""


def _check_text_size(chars: int, limits: LoadLimits) -> None:
    if chars > limits.max_text_chars:
        raise FileRejected(f"extracted text is over the limit of {limits.max_text_chars:,} characters")


# A reader's (title, text), and the text's outline where the format has one.
Extracted = tuple[str, str] | tuple[str, str, Outline]


def _read_text(data: bytes, limits: LoadLimits) -> Extracted:
    text = data.decode(limits.encoding)
    _check_text_size(len(text), limits)
    return "", text


def _read_html(data: bytes, limits: LoadLimits) -> Extracted:
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(data, "html.parser")
    for tag in soup(["script", "style", "noscript", "template"]):
        tag.decompose()
    title = soup.title.get_text(" ", strip=True) if soup.title else ""
    body = soup.body or soup
    headings = []
    for tag in body.find_all(["h1", "h2", "h3", "h4", "h5", "h6"]):
        heading = " ".join(tag.get_text(" ", strip=True).split())
        tag.string = heading  # one line of the extracted text, found again below
        if heading:
            headings.append((int(tag.name[1]), heading))
    # One block per line keeps paragraph boundaries visible to the chunker and BM25.
    lines = [line for line in (line.strip() for line in body.get_text("\n").splitlines()) if line]
    text = "\n".join(lines)
    _check_text_size(len(text), limits)
    return title, text, Outline(headings=html_headings(lines, headings))


def _read_pdf(data: bytes, limits: LoadLimits) -> Extracted:
    from pypdf import PdfReader

    # pypdf logs warnings for recoverable oddities; errors still raise.
    logging.getLogger("pypdf").setLevel(logging.ERROR)
    reader = PdfReader(io.BytesIO(data))
    pages: list[str] = []
    starts: list[tuple[int, int]] = []  # (page number, its first character in the joined text)
    chars = joined = 0
    for number, page in enumerate(reader.pages, start=1):
        text = (page.extract_text() or "").strip()
        chars += len(text)
        _check_text_size(chars, limits)  # stop at the cap, not after extracting everything
        if text:
            starts.append((number, joined))
            joined += len(text) + len(_PAGE_SEPARATOR)
            pages.append(text)
    meta_title = ""
    if reader.metadata is not None and reader.metadata.title:
        meta_title = str(reader.metadata.title).strip()
    return meta_title, _PAGE_SEPARATOR.join(pages), Outline(pages=tuple(starts))


_PAGE_SEPARATOR = "\n\n"

Reader = Callable[[bytes, LoadLimits], Extracted]

_READERS: dict[str, Reader] = {
    **dict.fromkeys(TEXT_SUFFIXES, _read_text),
    **dict.fromkeys(HTML_SUFFIXES, _read_html),
    **dict.fromkeys(PDF_SUFFIXES, _read_pdf),
}


def display_name(name: str) -> str:
    """A file name as valid UTF-8 text: unchanged when it already is, else each undecodable byte as
    `\\xNN` (JSON writers and tokenizers reject the lone surrogates Python uses for such bytes).
    A real file spelled with those escapes collides, and is then skipped as a duplicate id."""
    try:
        name.encode("utf-8")
        return name
    except UnicodeEncodeError:
        return os.fsencode(name).decode("utf-8", "backslashreplace")


def _read_capped(path: Path, limits: LoadLimits) -> bytes:
    # O_NOFOLLOW: a file swapped for a symlink after the tree walk is refused, not followed.
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise FileRejected("not a regular file")
        if info.st_size > limits.max_file_bytes:
            raise FileRejected(f"{info.st_size:,} bytes is over the limit of {limits.max_file_bytes:,} bytes")
        data = handle.read(limits.max_file_bytes + 1)  # a file growing while read is still capped
    if len(data) > limits.max_file_bytes:
        raise FileRejected(f"over the limit of {limits.max_file_bytes:,} bytes")
    return data


_WORKER_START_TIMEOUT_S = 120.0


def _import_parsers() -> None:
    import bs4  # noqa: F401
    import pypdf  # noqa: F401


def _cap_memory(megabytes: int) -> None:
    """The worker's initializer: an allocation past the cap raises MemoryError in the worker."""
    try:
        import resource
    except ImportError:  # not on Windows: only the time cap applies there
        return
    cap = megabytes * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


def _parse_capped(reader: Reader, data: bytes, limits: LoadLimits) -> Extracted | None:
    """In the worker: the reader's result, or None when it ran out of memory. The error itself is not
    sent back: its traceback holds the half-built tree, and pickling it would need memory too."""
    try:
        return reader(data, limits)
    except MemoryError:
        pass  # leaving the handler drops the traceback, and with it the tree
    gc.collect()
    return None


# Not in typeshed's stub of multiprocessing.pool; the class is there since Python 3.3.
_MaybeEncodingError: type[Exception] = getattr(multiprocessing.pool, "MaybeEncodingError", Exception)


class _IsolatedParser:
    """Runs HTML/PDF parsing in one worker process, killed and replaced when a file overruns its time
    or its memory.

    A thread cannot be stopped mid-parse; a process can, so the time cap is a real bound, and the
    memory cap applies to the worker alone. The worker is started with "spawn" (not fork): the
    indexer may already hold a model's threads.
    """

    def __init__(self) -> None:
        self._pool: Any = None
        self._memory_mb = 0

    def parse(self, reader: Reader, data: bytes, limits: LoadLimits) -> Extracted:
        if self._pool is not None and self._memory_mb != limits.parse_memory_mb:
            self.close()
        if self._pool is None:
            self._memory_mb = limits.parse_memory_mb
            context = multiprocessing.get_context("spawn")
            self._pool = context.Pool(1, initializer=_cap_memory, initargs=(limits.parse_memory_mb,))
            # Start-up and library imports take seconds on a busy host: not part of any file's time.
            self._pool.apply_async(_import_parsers).get(timeout=_WORKER_START_TIMEOUT_S)
        pending = self._pool.apply_async(_parse_capped, (reader, data, limits))
        try:
            result = cast(Extracted | None, pending.get(timeout=limits.parse_timeout_s))
        except multiprocessing.TimeoutError:
            self.close()
            raise FileRejected(f"parsing took longer than the limit of {limits.parse_timeout_s:g} s") from None
        except _MaybeEncodingError:
            # Pickling the result failed in the worker (out of memory under its cap, or a value that
            # cannot be pickled): the worker may be left in any state, so a new one takes over.
            self.close()
            raise FileRejected("the parsed text could not be sent back from the parse worker") from None
        if result is None:
            self.close()  # a worker that ran out of memory may be left in any state: start a new one
            raise FileRejected(f"parsing needed more than the limit of {limits.parse_memory_mb:,} MB")
        return result

    def close(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None


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
    readers = {**_READERS, **(readers or {})}
    real_root = root.resolve()
    parser = _IsolatedParser()
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
                data = _read_capped(path, limits)
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
    title = _capped_title(given_title or title) or _title_of(text, display_name(path.stem))
    # What the indexer derives wins: an author cannot move a file to another folder or type for a filter.
    metadata = {**supplied, **derived_fields(relative, path, title)}
    if markdown:
        outline = Outline(headings=markdown_headings(text))
    outline = dataclasses.replace(outline, locator=relative)
    return Document(relative, title, text, relative, metadata=metadata, outline=outline)
