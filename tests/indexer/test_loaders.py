"""Text extraction from .html and .pdf files, BEIR records, and skip-and-report for bad or oversized input."""

from __future__ import annotations

import io
from pathlib import Path

import orjson
import pytest

from indexer.formats import LoadLimits
from indexer.loaders import MAX_TITLE_CHARS, Document, Skipped
from indexer.sources import iter_source
from tests.helpers import pdf_file


def tiny_pdf(text: str, title: str = "") -> bytes:
    """A minimal valid one-page PDF with `text` in Helvetica (offsets computed, so pypdf reads it strictly)."""
    stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode()
    info = f"<< /Title ({title}) >>".encode() if title else b"<< >>"
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length " + str(len(stream)).encode() + b" >>\nstream\n" + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        info,
    ]
    return pdf_file(objects, "/Info 6 0 R ")


def _by_id(folder: Path) -> dict[str, Document | Skipped]:
    return {(i.doc_id if isinstance(i, Document) else i.source): i for i in iter_source(folder)}


def test_html_text_and_title(tmp_path: Path) -> None:
    (tmp_path / "page.html").write_text(
        "<html><head><title>Coral reefs</title><style>p {color: red}</style>"
        "<script>var secret = 1;</script></head><body><h1>Reefs</h1>"
        "<p>Coral reefs are built by colonies of tiny animals.</p><p>They need warm, clear water.</p></body></html>"
    )
    doc = _by_id(tmp_path)["page.html"]
    assert isinstance(doc, Document)
    assert doc.title == "Coral reefs"
    assert "built by colonies of tiny animals" in doc.text and "warm, clear water" in doc.text
    assert "secret" not in doc.text and "color" not in doc.text


def test_pdf_text_and_title(tmp_path: Path) -> None:
    (tmp_path / "paper.pdf").write_bytes(tiny_pdf("Mitochondria produce most of the cell's ATP.", "Cell power"))
    doc = _by_id(tmp_path)["paper.pdf"]
    assert isinstance(doc, Document), doc
    assert doc.title == "Cell power"
    assert "Mitochondria produce most of the cell" in doc.text


def test_bad_files_are_skipped_with_a_reason(tmp_path: Path) -> None:
    (tmp_path / "good.txt").write_text("Good\nA fine document.")
    (tmp_path / "broken.pdf").write_bytes(b"%PDF-1.4\nthis is not really a pdf")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (tmp_path / "empty.md").write_text("   \n")
    (tmp_path / "image.png").write_bytes(b"\x89PNG")
    (tmp_path / ".hidden.txt").write_text("not a document")
    items = _by_id(tmp_path)
    assert isinstance(items["good.txt"], Document)
    for name in ("broken.pdf", "latin1.txt", "empty.md"):
        assert isinstance(items[name], Skipped) and not items[name].ignored, name
    assert "not UTF-8" in items["latin1.txt"].reason  # type: ignore[union-attr]
    assert isinstance(items["image.png"], Skipped) and items["image.png"].ignored
    assert ".hidden.txt" not in items


def test_content_hash_tracks_text(tmp_path: Path) -> None:
    a = Document("x", "T", "one", "x")
    assert a.content_hash == Document("x", "T", "one", "y").content_hash
    assert a.content_hash != Document("x", "T", "two", "x").content_hash


def test_huge_html_and_beir_titles_are_capped(tmp_path: Path) -> None:
    # A title goes into every chunk and prompt: a multi-megabyte one must not.
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.html").write_text(
        f"<html><head><title>{'Long title ' * 300_000}</title></head><body><p>Short body.</p></body></html>"
    )
    page = _by_id(tmp_path / "docs")["page.html"]
    assert isinstance(page, Document), page
    assert page.title.startswith("Long title") and len(page.title) == MAX_TITLE_CHARS
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_bytes(orjson.dumps({"_id": "d1", "title": "T" * 3_000_000, "text": "Some text."}) + b"\n")
    [doc] = iter_source(corpus)
    assert isinstance(doc, Document) and doc.title == "T" * MAX_TITLE_CHARS and doc.text == "Some text."


def test_an_over_long_beir_line_is_skipped_and_reported(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    lines = [
        orjson.dumps({"_id": "a", "title": "A", "text": "First good record."}),
        orjson.dumps({"_id": "huge", "title": "H", "text": "x" * 5_000}),  # over the line cap
        orjson.dumps({"_id": "b", "title": "B", "text": "Second good record."}),
        orjson.dumps({"_id": "long", "title": "L", "text": "y" * 300}),  # fits the line, over the text cap
        orjson.dumps({"_id": "c", "title": "C", "text": "Third good record."}),
    ]
    corpus.write_bytes(b"\n".join(lines))  # no newline after the last line
    limits = LoadLimits(max_file_bytes=1_000, max_text_chars=200)
    items = list(iter_source(corpus, limits))
    assert [d.doc_id for d in items if isinstance(d, Document)] == ["a", "b", "c"]
    skipped = {s.source: s.reason for s in items if isinstance(s, Skipped)}
    assert set(skipped) == {"corpus.jsonl:2", "corpus.jsonl:4"}  # line numbers stay right after a skip
    assert "over the limit of 1,000 bytes" in skipped["corpus.jsonl:2"]
    assert "over the limit of 200 characters" in skipped["corpus.jsonl:4"]
    assert not any(s.ignored for s in items if isinstance(s, Skipped))  # reported, not just counted


def test_beir_lines_are_read_in_bounded_pieces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The line cap is what bounds memory: no read asks for more than the cap (or a bounded drain piece).
    class Recording(io.BytesIO):
        def __init__(self, data: bytes) -> None:
            super().__init__(data)
            self.sizes: list[int] = []

        def readline(self, size: int | None = -1, /) -> bytes:
            assert size is not None and 0 < size <= 1 << 20, f"unbounded read: {size}"
            self.sizes.append(size)
            return super().readline(size)

    handle = Recording(b'{"_id": "a", "text": "A."}\n' + b"z" * 3_000_000 + b'\n{"_id": "b", "text": "B."}')
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_bytes(b"")
    monkeypatch.setattr(Path, "open", lambda *_args, **_kwargs: handle)
    items = list(iter_source(corpus, LoadLimits(max_file_bytes=100)))
    assert [i.doc_id if isinstance(i, Document) else i.source for i in items] == ["a", "corpus.jsonl:2", "b"]
    assert handle.sizes and handle.sizes[0] == 101
