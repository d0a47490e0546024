"""Where a chunk stands in its source document: its locator, PDF page and section path, as the
indexer records it (docs/indexing.md, "Where a chunk stands") and the doors show it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class SourceLocation:
    """Where a chunk stands in its source (index format 3): the document's locator (its relative
    path, or a URL from its metadata), the PDF page of the chunk's first character (1-based; 0: not
    paged) and where that page begins in the document's text, the section headings in force, and
    the pages that begin inside the chunk (page, its first character), so a quote past a page
    break inside the chunk is given its own page (`at`)."""

    locator: str
    page: int = 0
    page_start: int = 0
    section: tuple[str, ...] = ()
    page_breaks: tuple[tuple[int, int], ...] = ()

    def at(self, offset: int) -> SourceLocation:
        """The location of the character at `offset` in the document's text: the page it is on."""
        page, page_start = self.page, self.page_start
        for later, first in self.page_breaks:
            if first > offset:
                break
            page, page_start = later, first
        return dataclasses.replace(self, page=page, page_start=page_start, page_breaks=())

    def record(self) -> dict[str, Any]:
        """Its JSON form: as the chunk store, the caches and Qdrant keep it, and as the doors show
        it (`page_breaks` only where pages begin inside the chunk)."""
        record: dict[str, Any] = {
            "locator": self.locator,
            "page": self.page,
            "page_start": self.page_start,
            "section": list(self.section),
        }
        if self.page_breaks:
            record["page_breaks"] = [list(pair) for pair in self.page_breaks]
        return record


def located_at(where: SourceLocation | None, offset: int) -> SourceLocation | None:
    """A chunk's location narrowed to the character at `offset` (a citation's quote): its page."""
    return None if where is None else where.at(offset)
