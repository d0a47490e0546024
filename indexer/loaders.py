"""Document sources: a folder tree of .txt/.md/.html/.pdf files, or a BEIR corpus.jsonl."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson

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


def _title_of(text: str, fallback: str) -> str:
    for line in text.splitlines():
        stripped = line.strip().lstrip("#").strip()
        if stripped:
            return stripped[:200]
    return fallback


def _read_text(path: Path) -> tuple[str, str]:
    text = path.read_text(encoding="utf-8")
    return _title_of(text, path.stem), text


def _read_html(path: Path) -> tuple[str, str]:
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(path.read_bytes(), "html.parser")
    for tag in soup(["script", "style", "noscript", "template"]):
        tag.decompose()
    title = soup.title.get_text(" ", strip=True) if soup.title else ""
    body = soup.body or soup
    # One block per line keeps paragraph boundaries visible to the chunker and BM25.
    lines = (line.strip() for line in body.get_text("\n").splitlines())
    text = "\n".join(line for line in lines if line)
    return title or _title_of(text, path.stem), text


def _read_pdf(path: Path) -> tuple[str, str]:
    from pypdf import PdfReader

    # pypdf logs warnings for recoverable oddities; errors still raise.
    logging.getLogger("pypdf").setLevel(logging.ERROR)
    reader = PdfReader(path)
    pages = [page.extract_text() or "" for page in reader.pages]
    text = "\n\n".join(p.strip() for p in pages if p.strip())
    meta_title = ""
    if reader.metadata is not None and reader.metadata.title:
        meta_title = str(reader.metadata.title).strip()
    return meta_title or _title_of(text, path.stem), text


_READERS: dict[str, Callable[[Path], tuple[str, str]]] = {
    **dict.fromkeys(TEXT_SUFFIXES, _read_text),
    **dict.fromkeys(HTML_SUFFIXES, _read_html),
    **dict.fromkeys(PDF_SUFFIXES, _read_pdf),
}


def iter_folder(root: Path) -> Iterator[Document | Skipped]:
    """Every supported file under `root`; doc_id is the path relative to root (POSIX form)."""
    return iter_folder_files(root, sorted(p for p in root.rglob("*") if p.is_file()))


def iter_folder_files(root: Path, paths: list[Path]) -> Iterator[Document | Skipped]:
    for path in paths:
        relative = path.relative_to(root).as_posix()
        if any(part.startswith(".") for part in path.relative_to(root).parts):
            continue  # hidden files and folders (.git, .DS_Store) are not documents
        reader = _READERS.get(path.suffix.lower())
        if reader is None:
            yield Skipped(relative, f"unsupported file type {path.suffix or '(none)'!r}", ignored=True)
            continue
        try:
            title, text = reader(path)
        except UnicodeDecodeError as exc:
            yield Skipped(relative, f"unreadable: not UTF-8 text ({exc.reason} at byte {exc.start})")
            continue
        except OSError as exc:
            yield Skipped(relative, f"unreadable: {exc.strerror or exc}")
            continue
        except Exception as exc:  # a malformed PDF/HTML raises library-specific errors: skip the file
            yield Skipped(relative, f"cannot extract text: {type(exc).__name__}: {exc}")
            continue
        if not text.strip():
            yield Skipped(relative, "no text")
            continue
        yield Document(relative, title, text, relative)


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
    if source.suffix.lower() in _READERS:
        return iter_folder_files(source.parent, [source])
    raise SourceError(
        f"{source}: unsupported source; give a folder (of {', '.join(sorted(SUPPORTED_SUFFIXES))} files) "
        "or a BEIR corpus .jsonl file"
    )
