"""The values a document source yields and the per-file limits every source applies."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any


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


def title_of(text: str, fallback: str) -> str:
    for line in text.splitlines():
        stripped = line.strip().lstrip("#").strip()
        if stripped:
            return capped_title(stripped)
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


def check_text_size(chars: int, limits: LoadLimits) -> None:
    if chars > limits.max_text_chars:
        raise FileRejected(f"extracted text is over the limit of {limits.max_text_chars:,} characters")
