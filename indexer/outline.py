"""Where a document's text stands in its source: the pages of a PDF and the section headings of
Markdown and HTML, by their character offsets in the extracted text, so each chunk can be given
its page and section path (docs/indexing.md, "Where a chunk stands")."""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass
from typing import Any

from ragserve.source_location import SourceLocation

# ATX headings ("## Title"), up to three spaces of indent; a closing run of #s is not part of it.
_ATX = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(```|~~~)")
_URL = re.compile(r"^https?://\S+$")
_MAX_HEADING_CHARS = 200


@dataclass(frozen=True, slots=True)
class Outline:
    """`pages`: (1-based page number, its first character in the text), in order; `headings`:
    (first character, level 1-6, title), in order; `locator`: the document's relative path or id."""

    pages: tuple[tuple[int, int], ...] = ()
    headings: tuple[tuple[int, int, str], ...] = ()
    locator: str = ""

    def to_record(self) -> dict[str, Any]:
        return {"pages": self.pages, "headings": self.headings, "locator": self.locator}

    @classmethod
    def of_record(cls, record: dict[str, Any] | None) -> Outline:
        if not record:
            return cls()
        pages = tuple((int(n), int(at)) for n, at in record.get("pages", ()))
        headings = tuple((int(at), int(level), str(title)) for at, level, title in record.get("headings", ()))
        return cls(pages, headings, str(record.get("locator", "")))

    def locate(self, start: int, end: int, metadata: dict[str, Any], fallback: str) -> SourceLocation:
        """The location of a chunk from `start` to `end`: a URL in the metadata names the document
        where there is one, else its locator; pages that begin inside the chunk are kept with it."""
        url = metadata.get("url")
        locator = url if isinstance(url, str) and _URL.match(url) else (self.locator or fallback)
        page, page_start = 0, 0
        breaks: tuple[tuple[int, int], ...] = ()
        if self.pages:
            firsts = [first for _, first in self.pages]
            at = max(bisect_right(firsts, start) - 1, 0)
            page, page_start = self.pages[at]
            breaks = self.pages[at + 1 : max(bisect_right(firsts, end - 1), at + 1)]
        return SourceLocation(locator, page, page_start, self._section(start), breaks)

    def _section(self, start: int) -> tuple[str, ...]:
        path: list[tuple[int, str]] = []
        for at, level, title in self.headings:
            if at > start:
                break
            while path and path[-1][0] >= level:
                path.pop()
            path.append((level, title))
        return tuple(title for _, title in path)


def markdown_headings(text: str) -> tuple[tuple[int, int, str], ...]:
    """ATX headings outside fenced code blocks, by their line's first character."""
    found: list[tuple[int, int, str]] = []
    offset, fenced = 0, False
    for line in text.splitlines(keepends=True):
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced and (match := _ATX.match(line.rstrip("\r\n"))):
            found.append((offset, len(match.group(1)), match.group(2).strip()[:_MAX_HEADING_CHARS]))
        offset += len(line)
    return tuple(found)


def html_headings(lines: list[str], heading_texts: list[tuple[int, str]]) -> tuple[tuple[int, int, str], ...]:
    """The extracted text's headings: each heading element's text (made one line before the text
    was extracted), found in order among the text's `lines` (joined by newlines)."""
    found: list[tuple[int, int, str]] = []
    offsets, at = [], 0
    for line in lines:
        offsets.append(at)
        at += len(line) + 1
    row = 0
    for level, title in heading_texts:
        for probe in range(row, len(lines)):
            if lines[probe] == title:
                found.append((offsets[probe], level, title[:_MAX_HEADING_CHARS]))
                row = probe + 1
                break
    return tuple(found)
