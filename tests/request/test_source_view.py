"""The window around a quote, rebuilt from a document's overlapping chunks."""

from __future__ import annotations

import pytest

from ragserve.errors import InvalidArgument
from ragserve.request.source_view import source_view
from ragserve.types import Chunk

DOCUMENT = "".join(f"Sentence number {n} of the document. " for n in range(40))


def _chunks(size: int, step: int) -> list[Chunk]:
    return [
        Chunk(f"d#{n}", "d", DOCUMENT[at : at + size], start=at, end=min(at + size, len(DOCUMENT)))
        for n, at in enumerate(range(0, len(DOCUMENT), step))
    ]


@pytest.mark.parametrize(("size", "step"), [(200, 150), (120, 120), (100, 130)])  # overlaps, adjacent, gaps
def test_the_window_is_the_documents_text_around_the_quote(size: int, step: int) -> None:
    chunks = _chunks(size, step)
    target = chunks[3]
    quote_start = DOCUMENT.index("Sentence", target.start)
    quote_end = DOCUMENT.index(".", quote_start) + 1
    view = source_view([target, *chunks], quote_start, quote_end, 250)
    assert view.marked[1] == DOCUMENT[quote_start:quote_end]
    assert view.text_start == quote_start - 250
    expected = DOCUMENT[view.text_start : view.text_start + len(view.text)]
    if step <= size:
        assert view.text == expected
    else:  # the characters no chunk holds come back as spaces, everything else in place
        assert all(a == b or a == " " for a, b in zip(view.text, expected, strict=True))


def test_a_quote_outside_its_chunk_or_too_much_context_is_refused() -> None:
    chunks = _chunks(200, 150)
    with pytest.raises(InvalidArgument, match="within the chunk"):
        source_view(chunks, 0, chunks[0].end + 1, 10)
    with pytest.raises(InvalidArgument, match="context_chars"):
        source_view(chunks, None, None, 10**6)
    whole = source_view([chunks[0]], None, None, 0)
    assert whole.marked == ("", chunks[0].text, "")
