"""How `ragserve ask` shows a passage's text and the reader's span."""

from __future__ import annotations

from typing import Any


def snippet(text: str, width: int = 100) -> str:
    """The passage's start on one line, cut at a word near `width` characters."""
    flat = " ".join(text.split())
    if len(flat) <= width:
        return flat
    cut = flat[:width].rsplit(" ", 1)[0]
    return cut + " ..."


def print_span(span: Any, passages: list[Any], reader_ms: float) -> None:
    """The reader's span and the sentence holding it, or that it found none."""
    if span is None or span.passage >= len(passages):
        print(f"reader ({reader_ms:.0f} ms): no answer span in the passages it read")
        return
    passage = passages[span.passage]
    verdict = "" if span.answers else " (below its threshold: the documents may not say)"
    sentence = snippet(passage.text[span.sentence_start : span.sentence_end], 160)
    print(f'reader ({reader_ms:.0f} ms): "{span.text}" in [{passage.rank}]{verdict}')
    print(f"  {sentence}")
