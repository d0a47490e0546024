"""Reading one file of the folder tree: its bytes under the size cap, then its (title, text) and
outline by format (plain text and Markdown, HTML, PDF), each under the extracted-text cap."""

from __future__ import annotations

import io
import logging
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from indexer.outline import Outline, html_headings

TEXT_SUFFIXES = {".txt", ".md"}
HTML_SUFFIXES = {".html", ".htm"}
PDF_SUFFIXES = {".pdf"}
SUPPORTED_SUFFIXES = TEXT_SUFFIXES | HTML_SUFFIXES | PDF_SUFFIXES


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


def check_text_size(chars: int, limits: LoadLimits) -> None:
    if chars > limits.max_text_chars:
        raise FileRejected(f"extracted text is over the limit of {limits.max_text_chars:,} characters")


# A reader's (title, text), and the text's outline where the format has one.
Extracted = tuple[str, str] | tuple[str, str, Outline]


def read_text(data: bytes, limits: LoadLimits) -> Extracted:
    text = data.decode(limits.encoding)
    check_text_size(len(text), limits)
    return "", text


def read_html(data: bytes, limits: LoadLimits) -> Extracted:
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
    check_text_size(len(text), limits)
    return title, text, Outline(headings=html_headings(lines, headings))


def read_pdf(data: bytes, limits: LoadLimits) -> Extracted:
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
        check_text_size(chars, limits)  # stop at the cap, not after extracting everything
        if text:
            starts.append((number, joined))
            joined += len(text) + len(PAGE_SEPARATOR)
            pages.append(text)
    meta_title = ""
    if reader.metadata is not None and reader.metadata.title:
        meta_title = str(reader.metadata.title).strip()
    return meta_title, PAGE_SEPARATOR.join(pages), Outline(pages=tuple(starts))


PAGE_SEPARATOR = "\n\n"

Reader = Callable[[bytes, LoadLimits], Extracted]

READERS: dict[str, Reader] = {
    **dict.fromkeys(TEXT_SUFFIXES, read_text),
    **dict.fromkeys(HTML_SUFFIXES, read_html),
    **dict.fromkeys(PDF_SUFFIXES, read_pdf),
}


def read_capped(path: Path, limits: LoadLimits) -> bytes:
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
